package l1cuda

import (
	"fmt"

	"github.com/kvtier/kvtier/internal/memcopy"
	"github.com/kvtier/kvtier/tiers"
)

// ReadPage copies one payload page of the pool into dst (exactly the
// kind's page_bytes), gathering its layer slices: what an engine reads
// when it uses a cached page. It must not race a copy batch that writes
// the same page (the host's placement state says when none does).
func (p *HostPool) ReadPage(page int, kind tiers.PayloadKind, dst []byte) error {
	base, slice, stride, err := p.pageAt(page, kind, len(dst))
	if err != nil {
		return err
	}
	memcopy.GatherStrided(dst, base, p.lay.layers, slice, stride)
	return nil
}

// WritePage stores src (exactly the kind's page_bytes) into one payload
// page of the pool, scattering it into its layer slices: what an engine's
// prefill writes. The same concurrency rule as ReadPage holds.
func (p *HostPool) WritePage(page int, kind tiers.PayloadKind, src []byte) error {
	base, slice, stride, err := p.pageAt(page, kind, len(src))
	if err != nil {
		return err
	}
	memcopy.ScatterStrided(base, src, p.lay.layers, slice, stride)
	return nil
}

func (p *HostPool) pageAt(page int, kind tiers.PayloadKind, n int) ([]byte, int, int, error) {
	if int(kind) >= len(p.lay.kinds) || page < 0 || page >= p.lay.pages {
		return nil, 0, 0, fmt.Errorf("l1 host pool: page %d kind %d out of range (%d pages, %d kinds): %w", page, kind, p.lay.pages, len(p.lay.kinds), tiers.ErrInvalid)
	}
	if int64(n) != p.lay.kinds[kind].PageBytes {
		return nil, 0, 0, fmt.Errorf("l1 host pool: page %d kind %d: buffer of %d bytes, page is %d: %w", page, kind, n, p.lay.kinds[kind].PageBytes, tiers.ErrInvalid)
	}
	if p.mem == nil {
		return nil, 0, 0, fmt.Errorf("l1 host pool: page %d: %w", page, tiers.ErrClosed)
	}
	slice := int(p.lay.slice(kind))
	return p.mem[kind][page*slice:], slice, p.lay.pages * slice, nil
}

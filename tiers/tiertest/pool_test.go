package tiertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/kvtier/kvtier/tiers"
)

// refPool is a minimal Pool v1 over process memory, written to the
// contract in tiers/pool.go so that the suite itself is tested: the real
// pools live in tiers/l1cuda. Copies run on a goroutine per batch and ack
// through a queue, like any asynchronous pool.
type refPool struct {
	g    tiers.PoolGeometry
	slab tiers.Slab
	mem  [][]byte // per kind: Pages * page_bytes

	mu     sync.Mutex
	next   tiers.BatchID
	acks   []tiers.Ack
	stats  tiers.PoolStats
	closed bool
	wg     sync.WaitGroup
	ready  chan struct{}
}

func newRefPool(g tiers.PoolGeometry, slab tiers.Slab) *refPool {
	p := &refPool{g: g, slab: slab, ready: make(chan struct{}, 1)}
	for _, k := range g.Payload.Kinds {
		p.mem = append(p.mem, make([]byte, int64(g.Pages)*k.PageBytes))
	}
	return p
}

func (p *refPool) Geometry() tiers.PoolGeometry { return p.g }

func (p *refPool) page(c tiers.PoolCopy) []byte {
	n := p.g.Payload.Kinds[c.Kind].PageBytes
	return p.mem[c.Kind][int64(c.Page)*n : int64(c.Page+1)*n]
}

func (p *refPool) check(batch []tiers.PoolCopy, toSlab bool) error {
	type dst struct {
		page int
		kind tiers.PayloadKind
	}
	seen := map[dst]bool{}
	for i, c := range batch {
		n, err := p.g.Payload.PageBytes(c.Kind)
		if err != nil {
			return fmt.Errorf("ref pool item %d: %w", i, err)
		}
		if c.Page < 0 || c.Page >= p.g.Pages {
			return fmt.Errorf("ref pool item %d: page %d of %d: %w", i, c.Page, p.g.Pages, tiers.ErrInvalid)
		}
		if c.Span.Length != n {
			return fmt.Errorf("ref pool item %d: span of %d bytes for a %d-byte page: %w", i, c.Span.Length, n, tiers.ErrInvalid)
		}
		if _, err := p.slab.Bytes(c.Span); err != nil {
			return fmt.Errorf("ref pool item %d: %w", i, err)
		}
		if !toSlab {
			if seen[dst{c.Page, c.Kind}] {
				return fmt.Errorf("ref pool item %d: page %d kind %d written twice: %w", i, c.Page, c.Kind, tiers.ErrInvalid)
			}
			seen[dst{c.Page, c.Kind}] = true
		}
	}
	return nil
}

func (p *refPool) copy(batch []tiers.PoolCopy, toSlab bool) (tiers.BatchID, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, fmt.Errorf("ref pool: %w", tiers.ErrClosed)
	}
	if len(batch) == 0 {
		return 0, nil
	}
	if err := p.check(batch, toSlab); err != nil {
		return 0, err
	}
	p.next++
	id := p.next
	batch = append([]tiers.PoolCopy(nil), batch...)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for i, c := range batch {
			span, _ := p.slab.Bytes(c.Span)
			if toSlab {
				copy(span, p.page(c))
			} else {
				copy(p.page(c), span)
			}
			p.mu.Lock()
			p.stats.Add(toSlab, 1, c.Span.Length)
			p.acks = append(p.acks, tiers.Ack{Batch: id, Index: i, Stage: tiers.AckCopied})
			p.mu.Unlock()
			select {
			case p.ready <- struct{}{}:
			default:
			}
		}
	}()
	return id, nil
}

func (p *refPool) CopyToSlab(_ context.Context, b []tiers.PoolCopy) (tiers.BatchID, error) {
	return p.copy(b, true)
}

func (p *refPool) CopyFromSlab(_ context.Context, b []tiers.PoolCopy) (tiers.BatchID, error) {
	return p.copy(b, false)
}

func (p *refPool) DrainAcks(dst []tiers.Ack) []tiers.Ack {
	p.mu.Lock()
	defer p.mu.Unlock()
	dst = append(dst, p.acks...)
	p.acks = p.acks[:0]
	return dst
}

func (p *refPool) AckReady() <-chan struct{} { return p.ready }

func (p *refPool) Stats() tiers.PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

func (p *refPool) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

func refPoolHarness() PoolHarness {
	g := tiers.PayloadGeometry{PageTokens: 16, Kinds: []tiers.PayloadSpec{
		{Name: "kv", PageBytes: 12_300}, {Name: "idx", PageBytes: 1_000},
	}}
	return PoolHarness{
		Payload: g,
		Open: func(t *testing.T) (tiers.Pool, tiers.Slab) {
			slab := NewHeapSlab(2 * PoolPages * 12_300)
			p := newRefPool(tiers.PoolGeometry{Pages: PoolPages, Payload: g, Device: "ref"}, slab)
			t.Cleanup(func() { p.Close() })
			return p, slab
		},
	}
}

func TestRunPoolOnReference(t *testing.T) {
	RunPool(t, refPoolHarness())
}

// TestCheckPoolAck feeds the ack checker streams that break the protocol:
// the suite must notice each.
func TestCheckPoolAck(t *testing.T) {
	want := map[tiers.BatchID]int{1: 2}
	ok := tiers.Ack{Batch: 1, Index: 0, Stage: tiers.AckCopied}
	cases := []struct {
		name string
		seen []tiers.Ack
		ack  tiers.Ack
		err  string // "" when the ack is fine
	}{
		{"first copied", nil, ok, ""},
		{"failed with error", nil, tiers.Ack{Batch: 1, Index: 1, Stage: tiers.AckFailed, Err: errors.New("x")}, ""},
		{"unknown batch", nil, tiers.Ack{Batch: 2, Index: 0, Stage: tiers.AckCopied}, "unknown batch"},
		{"index out of range", nil, tiers.Ack{Batch: 1, Index: 2, Stage: tiers.AckCopied}, "out of range"},
		{"negative index", nil, tiers.Ack{Batch: 1, Index: -1, Stage: tiers.AckCopied}, "out of range"},
		{"second ack", []tiers.Ack{ok}, ok, "second pool ack"},
		{"copied with error", nil, tiers.Ack{Batch: 1, Index: 0, Stage: tiers.AckCopied, Err: errors.New("x")}, "with an error"},
		{"failed without error", nil, tiers.Ack{Batch: 1, Index: 0, Stage: tiers.AckFailed}, "without an error"},
		{"store stage", nil, tiers.Ack{Batch: 1, Index: 0, Stage: tiers.AckDurable}, "want copied or failed"},
	}
	for _, c := range cases {
		err := checkPoolAck(c.ack, want, map[tiers.BatchID][]tiers.Ack{1: c.seen})
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s: %v, want nil", c.name, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.err)
		}
	}
}

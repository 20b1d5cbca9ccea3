package placement

import (
	"fmt"
	"strings"

	"github.com/kvtier/kvtier/tiers"
)

// MaxKinds is the largest number of payload kinds a Layout may have (Kinds
// is a 64-bit set).
const MaxKinds = 64

// Region is a run of whole pages of one payload kind inside one slab file.
// Regions of a kind are numbered in page order: the kind's page p lies in
// the region whose [FirstPage, FirstPage+Pages) contains it.
type Region struct {
	// Slab is the slab file the region lies in.
	Slab tiers.SlabID
	// Offset is the byte offset of the region's first page in that slab.
	Offset int64
	// Pages is the number of pages in the region.
	Pages int64
}

// KindLayout places the pages of one payload kind.
type KindLayout struct {
	// Name is the kind's name, e.g. "kv" (for errors and scenario output).
	Name string
	// PageBytes is the size of one page of this kind.
	PageBytes int64
	// Regions lists the kind's regions in page order. A page range never
	// straddles two regions, so it never straddles two slabs.
	Regions []Region
}

// Pages returns the kind's total number of pages.
func (k KindLayout) Pages() int64 {
	var n int64
	for _, r := range k.Regions {
		n += r.Pages
	}
	return n
}

// Layout maps the page space of every payload kind onto slab files. Kind k
// of a Layout is tiers.PayloadKind(k).
type Layout struct {
	// Kinds lists the payload kinds in PayloadKind order.
	Kinds []KindLayout
}

// Validate checks that every kind has positive page bytes and at least one
// non-empty region, and that no two regions of the layout overlap in bytes.
func (l Layout) Validate() error {
	if len(l.Kinds) == 0 || len(l.Kinds) > MaxKinds {
		return fmt.Errorf("placement layout: %d payload kinds, want 1..%d: %w", len(l.Kinds), MaxKinds, ErrInvalid)
	}
	type extent struct {
		slab       tiers.SlabID
		start, end int64
		what       string
	}
	var extents []extent
	for k, kl := range l.Kinds {
		if kl.PageBytes <= 0 {
			return fmt.Errorf("placement layout: kind %d (%s) page bytes %d: %w", k, kl.Name, kl.PageBytes, ErrInvalid)
		}
		if len(kl.Regions) == 0 {
			return fmt.Errorf("placement layout: kind %d (%s) has no regions: %w", k, kl.Name, ErrInvalid)
		}
		for i, r := range kl.Regions {
			if r.Pages <= 0 || r.Offset < 0 {
				return fmt.Errorf("placement layout: kind %d (%s) region %d: offset %d, %d pages: %w", k, kl.Name, i, r.Offset, r.Pages, ErrInvalid)
			}
			if r.Pages > (1<<62)/kl.PageBytes {
				return fmt.Errorf("placement layout: kind %d (%s) region %d: %d pages of %d bytes overflow: %w", k, kl.Name, i, r.Pages, kl.PageBytes, ErrInvalid)
			}
			extents = append(extents, extent{r.Slab, r.Offset, r.Offset + r.Pages*kl.PageBytes, fmt.Sprintf("kind %d (%s) region %d", k, kl.Name, i)})
		}
	}
	for i := range extents {
		for j := i + 1; j < len(extents); j++ {
			a, b := extents[i], extents[j]
			if a.slab == b.slab && a.start < b.end && b.start < a.end {
				return fmt.Errorf("placement layout: %s and %s overlap in slab %d: %w", a.what, b.what, a.slab, ErrInvalid)
			}
		}
	}
	return nil
}

// Span returns the slab span of a range of kind pages. The range must lie
// inside one region, as every range the Allocator hands out does.
func (l Layout) Span(kind tiers.PayloadKind, r Range) (tiers.Span, error) {
	if int(kind) >= len(l.Kinds) {
		return tiers.Span{}, fmt.Errorf("span of kind %d: layout has %d kinds: %w", kind, len(l.Kinds), ErrInvalid)
	}
	kl := l.Kinds[kind]
	first := int64(0)
	for _, reg := range kl.Regions {
		if r.Start >= first && r.Start < first+reg.Pages {
			if r.Pages <= 0 || r.Start+r.Pages > first+reg.Pages {
				return tiers.Span{}, fmt.Errorf("span of kind %d pages [%d,%d): straddles the end of region at page %d: %w", kind, r.Start, r.Start+r.Pages, first+reg.Pages, ErrInvalid)
			}
			return tiers.Span{
				Slab:   reg.Slab,
				Offset: reg.Offset + (r.Start-first)*kl.PageBytes,
				Length: r.Pages * kl.PageBytes,
			}, nil
		}
		first += reg.Pages
	}
	return tiers.Span{}, fmt.Errorf("span of kind %d page %d: beyond the kind's %d pages: %w", kind, r.Start, first, ErrInvalid)
}

// String renders the layout on one line, e.g.
// "kv/4096: s0@0+16 s1@0+8; idx/512: s0@65536+24".
func (l Layout) String() string {
	var b strings.Builder
	for k, kl := range l.Kinds {
		if k > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s/%d:", kl.Name, kl.PageBytes)
		for _, r := range kl.Regions {
			fmt.Fprintf(&b, " s%d@%d+%d", r.Slab, r.Offset, r.Pages)
		}
	}
	return b.String()
}

// PlanLayout carves slab files into per-kind regions so that every payload
// kind gets the same number of pages (a page has one payload of each kind),
// as many as fit. Kinds are laid out one after another in kind order; each
// kind's pages fill the slabs in ID order, a page that would straddle a slab
// boundary moves to the next slab, and each region starts at a multiple of
// align bytes (align <= 1 means no alignment). The result depends only on
// the arguments, so every rank plans the same layout.
func PlanLayout(slabs []tiers.SlabFile, payload tiers.PayloadGeometry, align int64) (Layout, error) {
	if len(payload.Kinds) == 0 || len(payload.Kinds) > MaxKinds {
		return Layout{}, fmt.Errorf("plan layout: %d payload kinds, want 1..%d: %w", len(payload.Kinds), MaxKinds, ErrInvalid)
	}
	if len(slabs) == 0 {
		return Layout{}, fmt.Errorf("plan layout: no slab files: %w", ErrInvalid)
	}
	if align < 1 {
		align = 1
	}
	var total, perPage int64
	for i, s := range slabs {
		if s.ID != tiers.SlabID(i) || s.Size <= 0 {
			return Layout{}, fmt.Errorf("plan layout: slab %d has id %d and size %d, want id %d and a positive size: %w", i, s.ID, s.Size, i, ErrInvalid)
		}
		total += s.Size
	}
	for k, spec := range payload.Kinds {
		if spec.PageBytes <= 0 {
			return Layout{}, fmt.Errorf("plan layout: payload kind %d (%s) page bytes %d: %w", k, spec.Name, spec.PageBytes, ErrInvalid)
		}
		perPage += spec.PageBytes
	}
	// The largest page count that fits is at most total/perPage; the fit is
	// monotone in the page count, so binary search for it.
	lo, hi := int64(0), total/perPage
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if _, ok := carve(slabs, payload, align, mid); ok {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	if lo == 0 {
		return Layout{}, fmt.Errorf("plan layout: slabs of %d bytes hold no page of every kind (%d bytes per page): %w", total, perPage, ErrInvalid)
	}
	l, _ := carve(slabs, payload, align, lo)
	return l, nil
}

// carve lays out pages pages of every kind, or reports that they do not fit.
func carve(slabs []tiers.SlabFile, payload tiers.PayloadGeometry, align, pages int64) (Layout, bool) {
	l := Layout{Kinds: make([]KindLayout, len(payload.Kinds))}
	slab, off := 0, int64(0)
	for k, spec := range payload.Kinds {
		kl := KindLayout{Name: spec.Name, PageBytes: spec.PageBytes}
		left := pages
		for left > 0 {
			if slab >= len(slabs) {
				return Layout{}, false
			}
			off = (off + align - 1) / align * align
			room := int64(0)
			if off < slabs[slab].Size {
				room = (slabs[slab].Size - off) / spec.PageBytes
			}
			if room == 0 {
				slab, off = slab+1, 0
				continue
			}
			n := min(room, left)
			kl.Regions = append(kl.Regions, Region{Slab: slabs[slab].ID, Offset: off, Pages: n})
			off += n * spec.PageBytes
			left -= n
		}
		l.Kinds[k] = kl
	}
	return l, true
}

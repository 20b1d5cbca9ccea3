package placement

import (
	"github.com/kvtier/kvtier/internal/invariants"

	"fmt"
	"slices"
)

// CheckInvariants verifies the allocator's state from scratch and returns
// the first violation, naming what was expected and what was found: free
// ranges sorted, inside the kind's page space, not crossing a region
// boundary, coalesced; the free lists' blocks neither empty nor overfull,
// their maxima right; object ranges the object's length per kind; no page both free and owned, or
// owned twice; every page of every kind either free or owned; the
// committed count right. It costs O(pages + ranges log ranges); tests call
// it, and builds with the invariants tag call it after every operation.
func (a *Allocator) CheckInvariants() error {
	type owned struct {
		start, end int64
		owner      string
	}
	for k, f := range a.free {
		var spans []owned
		var freePages int64
		count := 0
		prevEnd := int64(-1)
		var err error
		f.walk(func(start, pages int64) bool {
			count++
			if pages < 1 || start < 0 || start+pages > a.total[k] {
				err = fmt.Errorf("kind %d: free range [%d,%d) outside the kind's %d pages", k, start, start+pages, a.total[k])
				return false
			}
			if start < prevEnd {
				err = fmt.Errorf("kind %d: free range at %d overlaps or is out of order after one ending at %d", k, start, prevEnd)
				return false
			}
			if start == prevEnd && !f.isBound(start) {
				err = fmt.Errorf("kind %d: free ranges meet at page %d but were not coalesced", k, start)
				return false
			}
			for _, b := range f.bounds {
				if start < b && b < start+pages {
					err = fmt.Errorf("kind %d: free range [%d,%d) crosses the region boundary at page %d", k, start, start+pages, b)
					return false
				}
			}
			prevEnd = start + pages
			freePages += pages
			spans = append(spans, owned{start, start + pages, "free"})
			return true
		})
		if err != nil {
			return err
		}
		if count != f.count || freePages != f.pages {
			return fmt.Errorf("kind %d: free list holds %d ranges of %d pages, counters say %d ranges of %d pages", k, count, freePages, f.count, f.pages)
		}
		if err := f.checkBlocks(); err != nil {
			return fmt.Errorf("kind %d: %w", k, err)
		}
		ids := make([]ObjectID, 0, len(a.objects))
		for id := range a.objects {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			o := a.objects[id]
			if o.kinds&(1<<k) == 0 {
				continue
			}
			var n int64
			for _, r := range o.rangeList() {
				if int(r.Kind) != k {
					continue
				}
				if r.Pages < 1 || r.Start < 0 || r.Start+r.Pages > a.total[k] {
					return fmt.Errorf("kind %d: object %d range [%d,%d) outside the kind's %d pages", k, id, r.Start, r.Start+r.Pages, a.total[k])
				}
				for _, b := range f.bounds {
					if r.Start < b && b < r.Start+r.Pages {
						return fmt.Errorf("kind %d: object %d range [%d,%d) crosses the region boundary at page %d", k, id, r.Start, r.Start+r.Pages, b)
					}
				}
				n += r.Pages
				spans = append(spans, owned{r.Start, r.Start + r.Pages, fmt.Sprintf("object %d", id)})
			}
			if n != o.pages {
				return fmt.Errorf("kind %d: object %d has %d pages in ranges, want %d", k, id, n, o.pages)
			}
		}
		slices.SortFunc(spans, func(x, y owned) int {
			if x.start < y.start {
				return -1
			}
			if x.start > y.start {
				return 1
			}
			return 0
		})
		next := int64(0)
		for _, s := range spans {
			if s.start < next {
				return fmt.Errorf("kind %d: page %d is held twice (%s overlaps the range before it)", k, s.start, s.owner)
			}
			if s.start > next {
				return fmt.Errorf("kind %d: pages [%d,%d) are neither free nor owned", k, next, s.start)
			}
			next = s.end
		}
		if next != a.total[k] {
			return fmt.Errorf("kind %d: pages [%d,%d) are neither free nor owned", k, next, a.total[k])
		}
	}
	committed := 0
	for id, o := range a.objects {
		if o.id != id {
			return fmt.Errorf("object keyed %d says it is %d", id, o.id)
		}
		if o.kinds == 0 || o.kinds&^a.all != 0 {
			return fmt.Errorf("object %d holds kinds %v outside %v", id, o.kinds, a.all)
		}
		for i := 1; i < len(o.rangeList()); i++ {
			if o.rangeList()[i].Kind < o.rangeList()[i-1].Kind {
				return fmt.Errorf("object %d ranges are not grouped by kind", id)
			}
		}
		if o.committed {
			committed++
		}
	}
	if committed != a.committed {
		return fmt.Errorf("%d committed objects, counter says %d", committed, a.committed)
	}
	return nil
}

// checkBlocks checks that no block is empty or over blockMax ranges and
// that every block's maximum is its largest range's pages.
func (f *freeList) checkBlocks() error {
	for i, b := range f.blocks {
		if len(b.ranges) == 0 || len(b.ranges) > blockMax {
			return fmt.Errorf("free list block %d holds %d ranges, want 1..%d", i, len(b.ranges), blockMax)
		}
		m := int64(0)
		for _, r := range b.ranges {
			m = max(m, r.pages)
		}
		if m != b.maxPages {
			return fmt.Errorf("free list block %d at page %d: max %d, want %d", i, b.ranges[0].start, b.maxPages, m)
		}
	}
	return nil
}

// checkInvariants panics with the violation when invariant checks are
// compiled in (build tag invariants): a violation is a bug, and the state
// that proves it is in the message.
func (a *Allocator) checkInvariants(op string) {
	if !invariants.Enabled {
		return
	}
	if err := a.CheckInvariants(); err != nil {
		panic(fmt.Sprintf("placement: invariant broken after %s: %v", op, err))
	}
}

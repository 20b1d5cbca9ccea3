package host

import (
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/host/placement"
	"github.com/kvtier/kvtier/tiers"
)

// ErrPlanSums is returned by CompletePlan for sums that do not fit the
// plan: a count other than 0 or the plan's item count, or sums on a plan
// from the slab. The plan is not completed.
var ErrPlanSums = errors.New("host: plan sums do not fit the plan")

// slabPage names one L2 page: page Page of payload kind Kind's page space
// (placement.Layout), the unit a plan item writes and a Put reads.
type slabPage struct {
	kind tiers.PayloadKind
	page int64
}

// slabSums keeps, per L2 page, the CRC-32C an engine reported for the
// bytes its plan wrote there (engine.v1 Completion.sums), so the Put that
// spills the page carries the producer's sum instead of letting the store
// compute one over whatever the slab holds when it gathers. A sum is
// valid only for the bytes that plan wrote: the Node forgets it when it
// issues the next write into the page (another backup, a reload), which
// is also the only way a freed page is reused. At most one sum per page;
// a kind's table is allocated at its first sum (a stack whose engine
// reports none pays nothing), never on the step path after that.
type slabSums struct {
	layout placement.Layout
	sum    [][]uint32 // per kind, per page
	valid  [][]uint64 // per kind, a bit per page
}

func newSlabSums(l placement.Layout) slabSums {
	return slabSums{layout: l, sum: make([][]uint32, len(l.Kinds)), valid: make([][]uint64, len(l.Kinds))}
}

// set records sum for page p, allocating the kind's table at its first
// sum.
func (s *slabSums) set(p slabPage, sum uint32) {
	k := int(p.kind)
	if k >= len(s.sum) || p.page < 0 {
		return
	}
	if s.sum[k] == nil {
		n := s.layout.Kinds[k].Pages()
		s.sum[k] = make([]uint32, n)
		s.valid[k] = make([]uint64, (n+63)/64)
	}
	if p.page >= int64(len(s.sum[k])) {
		return
	}
	s.sum[k][p.page] = sum
	s.valid[k][p.page/64] |= 1 << (p.page % 64)
}

// forget drops page p's sum, if any.
func (s *slabSums) forget(p slabPage) {
	k := int(p.kind)
	if k >= len(s.valid) || s.valid[k] == nil || p.page < 0 || p.page >= int64(len(s.sum[k])) {
		return
	}
	s.valid[k][p.page/64] &^= 1 << (p.page % 64)
}

// get returns page p's sum and whether it has one.
func (s *slabSums) get(p slabPage) (uint32, bool) {
	k := int(p.kind)
	if k >= len(s.valid) || s.valid[k] == nil || p.page < 0 || p.page >= int64(len(s.sum[k])) {
		return 0, false
	}
	if s.valid[k][p.page/64]&(1<<(p.page%64)) == 0 {
		return 0, false
	}
	return s.sum[k][p.page], true
}

// any reports whether kind has ever had a sum (its table exists): a Put
// or Get of a kind without one skips the page lookups.
func (s *slabSums) any(kind tiers.PayloadKind) bool {
	return int(kind) < len(s.sum) && s.sum[kind] != nil
}

// pageOf returns the L2 page a one-page span of kind covers, or false
// when the span is not exactly one page of the kind's regions.
func (s *slabSums) pageOf(kind tiers.PayloadKind, sp tiers.Span) (slabPage, bool) {
	if int(kind) >= len(s.layout.Kinds) {
		return slabPage{}, false
	}
	kl := s.layout.Kinds[kind]
	if sp.Length != kl.PageBytes {
		return slabPage{}, false
	}
	first := int64(0)
	// NB: a kind has one region per slab file it spans, a handful: a
	// scan is cheaper than an index.
	for _, reg := range kl.Regions {
		end := reg.Offset + reg.Pages*kl.PageBytes
		if reg.Slab == sp.Slab && sp.Offset >= reg.Offset && sp.Offset < end {
			rel := sp.Offset - reg.Offset
			if rel%kl.PageBytes != 0 {
				return slabPage{}, false
			}
			return slabPage{kind: kind, page: first + rel/kl.PageBytes}, true
		}
		first += reg.Pages
	}
	return slabPage{}, false
}

// forgetSpan drops the sum of the page a one-page span of kind covers.
func (s *slabSums) forgetSpan(kind tiers.PayloadKind, sp tiers.Span) {
	if !s.any(kind) {
		return
	}
	if p, ok := s.pageOf(kind, sp); ok {
		s.forget(p)
	}
}

// spanSum returns the sum recorded for the page a one-page span of kind
// covers.
func (s *slabSums) spanSum(kind tiers.PayloadKind, sp tiers.Span) (uint32, bool) {
	if !s.any(kind) {
		return 0, false
	}
	p, ok := s.pageOf(kind, sp)
	if !ok {
		return 0, false
	}
	return s.get(p)
}

// checkPlanSums says why sums do not fit batch b, or nil.
func checkPlanSums(id tiers.BatchID, b *batch, sums []uint32) error {
	switch {
	case len(sums) == 0:
		return nil
	case b == nil:
		return fmt.Errorf("plan %d: %d sums for a plan the node does not know: %w", id, len(sums), ErrPlanSums)
	case b.dir != control.ToL2:
		return fmt.Errorf("plan %d is FROM_SLAB: %d sums, want none (sums are of the bytes a TO_SLAB plan wrote): %w", id, len(sums), ErrPlanSums)
	case len(sums) != len(b.state):
		return fmt.Errorf("plan %d: %d sums for its %d items, want one per item in item order or none: %w", id, len(sums), len(b.state), ErrPlanSums)
	}
	return nil
}

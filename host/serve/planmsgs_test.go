package serve

import (
	"testing"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/host"
	"github.com/kvtier/kvtier/tiers"
)

// TestPlanMsgs: planned copies in plan order become one CopyPlan a
// batch, with the batch's direction and every item's fields, appended
// after what dst held.
func TestPlanMsgs(t *testing.T) {
	pc := func(batch tiers.BatchID, index int, toSlab bool, page int) host.PlannedCopy {
		return host.PlannedCopy{Batch: batch, Index: index, ToSlab: toSlab,
			Copy: tiers.PoolCopy{Page: page, Kind: tiers.PayloadKind(page % 2), Span: tiers.Span{Slab: 1, Offset: int64(page) << 14, Length: 1 << 14}}}
	}
	for _, tc := range []struct {
		name  string
		pcs   []host.PlannedCopy
		sizes []int // items a plan, in order
	}{
		{"none", nil, nil},
		{"one", []host.PlannedCopy{pc(7, 0, true, 3)}, []int{1}},
		{"batches", []host.PlannedCopy{pc(7, 0, true, 3), pc(7, 1, true, 4), pc(9, 0, false, 5), pc(11, 0, true, 6), pc(11, 1, true, 8), pc(11, 2, true, 9)}, []int{2, 1, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prior := &pb.CopyPlan{Plan: 1}
			got := planMsgs([]*pb.CopyPlan{prior}, tc.pcs)
			if len(got) != 1+len(tc.sizes) || got[0] != prior {
				t.Fatalf("%d plans after the prior one, want %d", len(got)-1, len(tc.sizes))
			}
			k := 0
			for i, m := range got[1:] {
				if len(m.GetItems()) != tc.sizes[i] {
					t.Fatalf("plan %d: %d items, want %d", i, len(m.GetItems()), tc.sizes[i])
				}
				for _, it := range m.GetItems() {
					want := tc.pcs[k]
					dir := pb.Direction_DIRECTION_FROM_SLAB
					if want.ToSlab {
						dir = pb.Direction_DIRECTION_TO_SLAB
					}
					c := want.Copy
					if m.GetPlan() != uint64(want.Batch) || m.GetDirection() != dir || it.GetL1Page() != uint32(c.Page) || it.GetKind() != uint32(c.Kind) ||
						it.GetSlab() != uint32(c.Span.Slab) || it.GetOffset() != uint64(c.Span.Offset) || it.GetLength() != uint64(c.Span.Length) {
						t.Fatalf("item %d: plan %d %v %+v, want %+v", k, m.GetPlan(), m.GetDirection(), it, want)
					}
					k++
				}
			}
			if k != len(tc.pcs) {
				t.Fatalf("%d items, want %d", k, len(tc.pcs))
			}
		})
	}
}

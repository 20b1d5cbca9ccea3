package pagestore

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "github.com/kvtier/kvtier/api/storev1"
)

// TestExistsPrefetch: an exists with prefetch starts reloading the pages
// it answers L3 for; the get that follows finds them in L2. Without
// prefetch, the same get reloads from L3.
func TestExistsPrefetch(t *testing.T) {
	for _, prefetch := range []bool{true, false} {
		t.Run(fmt.Sprintf("prefetch=%v", prefetch), func(t *testing.T) {
			// 16 slots: a prefetch may load 4 at once (a quarter).
			h := newHarness(t, 16, false, nil, Limits{})
			ses := h.register(t)
			keys := h.setPast(t, ses, "p", 24)
			// The slab holds the last 16; the first 8 are only in the store.
			first := keys[:4]
			ex, err := h.d.BatchExists(context.Background(), &pb.ExistsRequest{Session: ses, Keys: first, Prefetch: prefetch})
			if err != nil {
				t.Fatal(err)
			}
			if ex.GetPresent() != 4 || ex.GetTiers()[0] != pb.Tier_TIER_L3 {
				t.Fatalf("exists %d %v", ex.GetPresent(), ex.GetTiers())
			}
			for range 5000 {
				if h.d.Gauges().Loading == 0 {
					break
				}
				time.Sleep(time.Millisecond)
			}
			st := h.d.Snapshot()
			if want := uint64(0); prefetch {
				want = 4
				if st.GetPrefetchPages() != want {
					t.Fatalf("prefetch pages %d, want %d (%v)", st.GetPrefetchPages(), want, st)
				}
			} else if st.GetPrefetchPages() != 0 {
				t.Fatalf("prefetch pages %d without prefetch", st.GetPrefetchPages())
			}
			l3 := st.GetHitPagesL3()
			for j, s := range h.get(t, ses, 5000, first...) {
				if s != pb.GetStatus_GET_STATUS_HIT {
					t.Fatalf("key %s: %v", first[j], s)
				}
			}
			st = h.d.Snapshot()
			switch got := st.GetHitPagesL3() - l3; {
			case prefetch && got != 0:
				t.Fatalf("%d pages came from L3 after the prefetch, want 0 (from L2)", got)
			case !prefetch && got != 4:
				t.Fatalf("%d pages came from L3, want 4", got)
			}
		})
	}
}

// TestExistsPrefetchBudget: a prefetch loads at most a quarter of the slab
// at once; the rest stays in L3, counted as skipped, and the get still
// finds every page.
func TestExistsPrefetchBudget(t *testing.T) {
	h := newHarness(t, 8, false, nil, Limits{})
	ses := h.register(t)
	keys := h.setPast(t, ses, "q", 16)
	if _, err := h.d.BatchExists(context.Background(), &pb.ExistsRequest{Session: ses, Keys: keys[:4], Prefetch: true}); err != nil {
		t.Fatal(err)
	}
	st := h.d.Snapshot()
	if st.GetPrefetchPages() != 2 || st.GetPrefetchSkippedPages() != 2 {
		t.Fatalf("prefetch started %d, skipped %d; want 2 and 2 (a quarter of 8 slots)", st.GetPrefetchPages(), st.GetPrefetchSkippedPages())
	}
	for j, s := range h.get(t, ses, 5000, keys[:4]...) {
		if s != pb.GetStatus_GET_STATUS_HIT {
			t.Fatalf("key %s: %v", keys[j], s)
		}
	}
}

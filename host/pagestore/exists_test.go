package pagestore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	pb "github.com/kvtier/kvtier/api/storev1"
	"github.com/kvtier/kvtier/tiers"
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

// TestExistsWait: an exists with wait_ms answers once the reloads of the
// pages it places in L3 have landed (TIER_L2 then), or when wait_ms
// passes (TIER_L3 still); with nothing reloading it answers at once.
func TestExistsWait(t *testing.T) {
	type tc struct {
		name     string
		prefetch bool // this call starts the reloads (else an earlier call does)
		waitMs   uint32
		release  time.Duration // the store's gets go on after this (-1: only after the call)
		inL2     bool          // the keys are in the slab already
		wantTier pb.Tier
		wantWait bool // the call waited on reloads
		minTook  time.Duration
	}
	for _, c := range []tc{
		{name: "prefetch-lands", prefetch: true, waitMs: 5000, release: 30 * time.Millisecond, wantTier: pb.Tier_TIER_L2, wantWait: true, minTook: 30 * time.Millisecond},
		{name: "earlier-prefetch-lands", waitMs: 5000, release: 30 * time.Millisecond, wantTier: pb.Tier_TIER_L2, wantWait: true, minTook: 30 * time.Millisecond},
		{name: "wait-passes", prefetch: true, waitMs: 40, release: -1, wantTier: pb.Tier_TIER_L3, wantWait: true, minTook: 40 * time.Millisecond},
		{name: "no-wait", prefetch: true, waitMs: 0, release: -1, wantTier: pb.Tier_TIER_L3},
		{name: "nothing-reloading", prefetch: true, waitMs: 5000, release: 0, inL2: true, wantTier: pb.Tier_TIER_L2},
	} {
		t.Run(c.name, func(t *testing.T) {
			bs := &blockingStore{unblock: make(chan struct{}), started: make(chan struct{}, 1)}
			h := newHarness(t, 16, false, func(s tiers.Store) tiers.Store { bs.Store = s; return bs }, Limits{})
			ses := h.register(t)
			keys := h.setPast(t, ses, "w", 24)
			ask := keys[:4] // only in the store: the slab holds the last 16
			if c.inL2 {
				ask = keys[20:]
			}
			if !c.prefetch {
				if _, err := h.d.BatchExists(context.Background(), &pb.ExistsRequest{Session: ses, Keys: ask, Prefetch: true}); err != nil {
					t.Fatal(err)
				}
			}
			var once sync.Once
			unblock := func() { once.Do(func() { close(bs.unblock) }) }
			defer unblock()
			// NB: the clock starts before the release's timer, so that the
			// answer's wait is at least the release whatever runs between
			// them (a loaded CI machine: 25 ms of a 30 ms release once).
			t0 := time.Now()
			if c.release >= 0 {
				time.AfterFunc(c.release, unblock)
			}
			ex, err := h.d.BatchExists(context.Background(), &pb.ExistsRequest{Session: ses, Keys: ask, Prefetch: c.prefetch, WaitMs: c.waitMs})
			took := time.Since(t0)
			if err != nil {
				t.Fatal(err)
			}
			if ex.GetPresent() != 4 {
				t.Fatalf("present %d, want 4 (%v)", ex.GetPresent(), ex.GetTiers())
			}
			for i, tier := range ex.GetTiers() {
				if tier != c.wantTier {
					t.Fatalf("page %d: %v, want %v (took %v)", i, tier, c.wantTier, took)
				}
			}
			if took < c.minTook {
				t.Fatalf("answered after %v, before %v", took, c.minTook)
			}
			h.d.mu.Lock()
			waits := h.d.st.existsWaits
			h.d.mu.Unlock()
			if (waits > 0) != c.wantWait {
				t.Fatalf("waited on reloads %d times, want %v", waits, c.wantWait)
			}
			unblock()
			// Whatever the answer, the get that follows finds every page.
			for j, s := range h.get(t, ses, 5000, ask...) {
				if s != pb.GetStatus_GET_STATUS_HIT {
					t.Fatalf("key %s: %v", ask[j], s)
				}
			}
		})
	}
}

// countingStore is a fault-injection wrapper: its Get waits until unblock
// is closed and counts the pages it is asked for; the rest is the real
// store underneath.
type countingStore struct {
	tiers.Store
	unblock chan struct{}
	mu      sync.Mutex
	gets    int
}

func (c *countingStore) Get(ctx context.Context, batch []tiers.GetRequest, res []error) error {
	c.mu.Lock()
	c.gets += len(batch)
	c.mu.Unlock()
	<-c.unblock
	return c.Store.Get(ctx, batch, res)
}

// TestGetWaitsForPrefetch: a get of pages a prefetch is still reloading
// waits for that prefetch and finds them in the slab: each page is read
// from the store once. A prefetch still out when the get's deadline ends
// leaves the pages to time out, and a later get finds them.
func TestGetWaitsForPrefetch(t *testing.T) {
	for _, c := range []struct {
		name     string
		release  time.Duration // the store's gets go on after this
		deadline uint32        // the get's, ms
		want     pb.GetStatus
	}{
		{name: "prefetch-lands", release: 30 * time.Millisecond, deadline: 5000, want: pb.GetStatus_GET_STATUS_HIT},
		{name: "deadline-first", release: 300 * time.Millisecond, deadline: 40, want: pb.GetStatus_GET_STATUS_TIMEOUT},
	} {
		t.Run(c.name, func(t *testing.T) {
			cs := &countingStore{unblock: make(chan struct{})}
			h := newHarness(t, 16, false, func(s tiers.Store) tiers.Store { cs.Store = s; return cs }, Limits{})
			ses := h.register(t)
			keys := h.setPast(t, ses, "g", 24)
			ask := keys[:4] // only in the store
			if _, err := h.d.BatchExists(context.Background(), &pb.ExistsRequest{Session: ses, Keys: ask, Prefetch: true}); err != nil {
				t.Fatal(err)
			}
			var once sync.Once
			unblock := func() { once.Do(func() { close(cs.unblock) }) }
			defer unblock()
			time.AfterFunc(c.release, unblock)
			for j, st := range h.get(t, ses, c.deadline, ask...) {
				if st != c.want {
					t.Fatalf("key %s: %v, want %v", ask[j], st, c.want)
				}
			}
			unblock()
			for j, st := range h.get(t, ses, 5000, ask...) {
				if st != pb.GetStatus_GET_STATUS_HIT {
					t.Fatalf("later get, key %s: %v", ask[j], st)
				}
			}
			cs.mu.Lock()
			gets := cs.gets
			cs.mu.Unlock()
			// Two payload kinds a page; the prefetch read each once.
			if want := 2 * len(ask); gets != want {
				t.Fatalf("the store was asked for %d page kinds, want %d (each page read once)", gets, want)
			}
		})
	}
}

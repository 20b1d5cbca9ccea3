package replay

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/adaptive"
	"github.com/kvtier/kvtier/workload"
)

// lookaheadRegistry is registry with adaptive, the default policy.
func lookaheadRegistry(t testing.TB) *policy.Registry {
	t.Helper()
	reg := registry(t)
	if err := adaptive.Register(reg); err != nil {
		t.Fatal(err)
	}
	return reg
}

func evictor(t testing.TB, reg *policy.Registry, tr *Trace, name string) policy.Evictor {
	t.Helper()
	ev, err := NewEvictor(reg, tr, Spec{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// TestLookaheadZeroIsRun: lookahead 0 is the plain replay bit for bit, by
// Run, RunLookahead and RunPlan alike, and gives the figures Run gave on
// the generated trace before lookahead existed (commit 15d151d).
func TestLookaheadZeroIsRun(t *testing.T) {
	tr := generated(t)
	reg := lookaheadRegistry(t)
	for _, c := range []struct {
		policy    string
		blocks    int64
		hitTokens int64
		evictions int64
		evicted   int64 // whole nodes
	}{
		{"lru", 40, 798720, 830, 189},
		{"lru", 120, 824832, 699, 155},
		{"slru", 40, 812544, 803, 176},
		{"s3fifo", 40, 818688, 791, 175},
		{"sieve", 40, 806912, 814, 182},
		{"adaptive", 40, 803840, 820, 175},
		{"adaptive", 120, 824832, 699, 154},
		{"belady", 40, 824832, 779, 172},
		{"belady", 120, 824832, 699, 155},
	} {
		t.Run(fmt.Sprintf("%s@%d", c.policy, c.blocks), func(t *testing.T) {
			capTokens := c.blocks * workload.BlockTokens
			want, err := Run(tr, evictor(t, reg, tr, c.policy), capTokens, nil)
			if err != nil {
				t.Fatal(err)
			}
			if want.HitTokens != c.hitTokens || want.Evictions != c.evictions || want.EvictedNodes != c.evicted || want.Lookahead != 0 {
				t.Errorf("Run: %d hit tokens, %d evictions, %d nodes evicted, lookahead %d; want %d, %d, %d, 0",
					want.HitTokens, want.Evictions, want.EvictedNodes, want.Lookahead, c.hitTokens, c.evictions, c.evicted)
			}
			got, err := RunLookahead(tr, evictor(t, reg, tr, c.policy), capTokens, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("RunLookahead 0 differs from Run:\n%+v\n%+v", got, want)
			}
			rows, err := RunPlan(context.Background(), tr, reg, Plan{Policies: []Spec{{Name: c.policy}}, Capacities: []int64{capTokens}, Breakdown: true})
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) != 1 || rows[0] != want {
				t.Errorf("RunPlan lookahead 0 differs from Run:\n%+v\n%+v", rows, want)
			}
		})
	}
}

// TestLookaheadSavesAPage: LRU evicts the oldest leaf [A] to admit [D],
// though the next request asks for A; with A's request in the window, A
// is locked and LRU trims C (never asked for again) instead, so A hits.
// Belady keeps A anyway: protection cannot beat the oracle here.
func TestLookaheadSavesAPage(t *testing.T) {
	req := func(ids ...uint64) workload.Request {
		return workload.Request{InputLength: len(ids) * workload.BlockTokens, HashIDs: ids}
	}
	tr, err := Compile("saves", []workload.Request{
		req(1),    // A
		req(2, 3), // B C: the tree is full (3 pages)
		req(4),    // D: one page must go
		req(1),    // A again
	})
	if err != nil {
		t.Fatal(err)
	}
	reg := lookaheadRegistry(t)
	for _, c := range []struct {
		policy    string
		lookahead int
		hitTokens int64
		evictions int64
		trims     int64 // victims trimmed from their tail
	}{
		// Request 2 evicts A; request 3 misses it and evicts C.
		{"lru", 0, 0, 2, 1},
		{"lru", 1, 512, 1, 1},
		{"lru", 2, 512, 1, 1},
		// Request 3 enters the window before A is inserted; its lock
		// moves down to A when request 0 inserts it.
		{"lru", 100, 512, 1, 1},
		{"belady", 0, 512, 1, 1},
		{"belady", 1, 512, 1, 1},
	} {
		t.Run(fmt.Sprintf("%s/%d", c.policy, c.lookahead), func(t *testing.T) {
			res, err := RunLookahead(tr, evictor(t, reg, tr, c.policy), 3*workload.BlockTokens, c.lookahead, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.HitTokens != c.hitTokens || res.Evictions != c.evictions || res.TrimmedNodes != c.trims || res.Lookahead != c.lookahead {
				t.Errorf("%d hit tokens, %d evictions (%d trims), lookahead %d; want %d, %d (%d), %d",
					res.HitTokens, res.Evictions, res.TrimmedNodes, res.Lookahead, c.hitTokens, c.evictions, c.trims, c.lookahead)
			}
			checkAccounting(t, tr, res)
		})
	}
}

// TestLookaheadYieldsToTheRunningRequest: protection never costs the
// running request its pages, and a request longer than the capacity
// inserts what fits, as without lookahead; nothing errors.
func TestLookaheadYieldsToTheRunningRequest(t *testing.T) {
	req := func(ids ...uint64) workload.Request {
		return workload.Request{InputLength: len(ids) * workload.BlockTokens, HashIDs: ids}
	}
	long := make([]uint64, 10)
	for i := range long {
		long[i] = uint64(100 + i)
	}
	for _, c := range []struct {
		name      string
		reqs      []workload.Request
		blocks    int64
		lookahead int
		hitBlocks int64
		// notAdmitted: blocks missed because their request did not fit.
		notAdmitted int64
		// asZero: the replay equals lookahead 0's.
		asZero bool
	}{
		// At request 1 the window locks A B C, all of the capacity; the
		// lock is released and D E F fit. Request 2 misses, as with no
		// lookahead.
		{"window fills the capacity", []workload.Request{req(1, 2, 3), req(4, 5, 6), req(1, 2, 3)}, 3, 1, 0, 0, true},
		// Two waiting requests lock two pages each of four; the running
		// one needs three: the furthest (request 4: 1 2) yields first,
		// then the nearest (request 3: 7 8) gives its tail page. Only
		// request 3's page 7 is left to hit.
		{"released furthest first", []workload.Request{req(1, 2), req(7, 8), req(9, 10, 11), req(7, 8), req(1, 2)}, 4, 2, 1, 0, false},
		// Requests longer than the capacity insert the 4 (then 2) pages
		// that fit and hit them next time, as with no lookahead.
		{"longer than the capacity", []workload.Request{req(long...), req(long...), req(long...)}, 4, 2, 8, 12, true},
		{"longer than the capacity, lookahead past the end", []workload.Request{req(long...), req(long...), req(long...)}, 2, 50, 4, 16, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, err := Compile(c.name, c.reqs)
			if err != nil {
				t.Fatal(err)
			}
			reg := lookaheadRegistry(t)
			for _, name := range []string{"lru", "adaptive", "belady"} {
				res, err := RunLookahead(tr, evictor(t, reg, tr, name), c.blocks*workload.BlockTokens, c.lookahead, nil)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if res.HitBlocks != c.hitBlocks || res.Misses.NotAdmitted != c.notAdmitted {
					t.Errorf("%s: %d hit blocks, %d not admitted; want %d, %d", name, res.HitBlocks, res.Misses.NotAdmitted, c.hitBlocks, c.notAdmitted)
				}
				checkAccounting(t, tr, res)
				if !c.asZero {
					continue
				}
				zero, err := Run(tr, evictor(t, reg, tr, name), c.blocks*workload.BlockTokens, nil)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				zero.Lookahead = c.lookahead
				if res != zero {
					t.Errorf("%s: lookahead %d differs from lookahead 0:\n%+v\n%+v", name, c.lookahead, res, zero)
				}
			}
		})
	}
}

// TestLookaheadReplays: every policy replays the generated trace at every
// lookahead without error, within the capacity, with every block a hit or
// a classified miss, the same twice; the infinite row does not change.
func TestLookaheadReplays(t *testing.T) {
	tr := generated(t)
	reg := lookaheadRegistry(t)
	var infinite Result
	for _, n := range []int{0, 1, 4, 16, 64, 1000} {
		plan := Plan{
			Policies:   []Spec{{Name: "lru"}, {Name: "slru"}, {Name: "s3fifo"}, {Name: "sieve"}, {Name: "adaptive"}},
			Capacities: []int64{8 * workload.BlockTokens, 40 * workload.BlockTokens, 120 * workload.BlockTokens},
			Belady:     true,
			Infinite:   true,
			Breakdown:  true,
			Lookahead:  n,
			Parallel:   1,
		}
		a, err := RunPlan(context.Background(), tr, reg, plan)
		if err != nil {
			t.Fatalf("lookahead %d: %v", n, err)
		}
		plan.Parallel = 2
		b, err := RunPlan(context.Background(), tr, reg, plan)
		if err != nil {
			t.Fatalf("lookahead %d: %v", n, err)
		}
		for i := range a {
			if a[i] != b[i] {
				t.Errorf("lookahead %d: row %d differs between runs:\n%+v\n%+v", n, i, a[i], b[i])
			}
			if a[i].Lookahead != n {
				t.Errorf("lookahead %d: row %d says %d", n, i, a[i].Lookahead)
			}
			checkAccounting(t, tr, a[i])
		}
		inf := a[len(a)-1]
		inf.Lookahead = 0
		if n == 0 {
			infinite = inf
		} else if inf != infinite {
			t.Errorf("lookahead %d changed the infinite row:\n%+v\n%+v", n, inf, infinite)
		}
	}
	if _, err := RunPlan(context.Background(), tr, reg, Plan{Policies: []Spec{{Name: "lru"}}, Capacities: []int64{1 << 20}, Lookahead: -1}); err == nil {
		t.Error("lookahead -1 accepted")
	}
}

// TestLookaheadYieldsFurthestFirst pins the order in which the window's
// locks yield to a running request that does not fit: the furthest waiting
// request first.
func TestLookaheadYieldsFurthestFirst(t *testing.T) {
	req := func(ids ...uint64) workload.Request {
		return workload.Request{InputLength: len(ids) * workload.BlockTokens, HashIDs: ids}
	}
	tr, err := Compile("yields", []workload.Request{req(1, 2), req(7, 8), req(9, 10, 11), req(7, 8), req(1, 2)})
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRunner(tr, evictor(t, lookaheadRegistry(t), tr, "lru"), 4*workload.BlockTokens, true)
	if err != nil {
		t.Fatal(err)
	}
	r.queue = newWaitingQueue(2)
	if err := r.queue.enter(r, 1); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := r.request(i); err != nil {
			t.Fatal(err)
		}
	}
	// Request 3 (7 8) is locked at its node; request 4 enters next.
	if n := r.queue.held[3%(r.queue.n+1)]; n == nil || n.Pages() != 2 || n.Depth() != 0 {
		t.Fatalf("request 3 holds %v, want its 2-page node", n)
	}
	if err := r.request(2); err != nil {
		t.Fatal(err)
	}
	if r.queue.yielded != 2 || r.res.Evictions != 3 || r.res.EvictedNodes != 1 || r.res.TrimmedNodes != 1 {
		t.Errorf("%d locks yielded, %d pages evicted (%d whole, %d trims); want 2, 3 (1 whole [1 2], 1 trim of 8)",
			r.queue.yielded, r.res.Evictions, r.res.EvictedNodes, r.res.TrimmedNodes)
	}
}

// BenchmarkLookahead times replays of the Mooncake trace at 3M tokens
// with adaptive at several lookaheads (skipped without the shared trace).
func BenchmarkLookahead(b *testing.B) {
	tr := sharedTrace(b, "mooncake_synthetic_trace.jsonl")
	reg := lookaheadRegistry(b)
	for _, n := range []int{0, 64, 1024} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				if _, err := RunLookahead(tr, evictor(b, reg, tr, "adaptive"), 3_000_000, n, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(tr.Requests())*float64(b.N)/b.Elapsed().Seconds(), "requests/s")
		})
	}
}

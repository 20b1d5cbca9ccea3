package workload_test

import (
	"context"
	"math"
	"testing"

	"github.com/kvtier/kvtier/host/replay"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/belady"
	"github.com/kvtier/kvtier/policy/lru"
	"github.com/kvtier/kvtier/workload"
)

// TestDefaultWorkloadProfile replays the default workload through the real
// replay path and pins the hit-rate profile its documentation promises:
// hit rates grow with capacity over 1M-10M tokens, and the gap between LRU
// and the Belady bound is wide enough for policies to differ.
func TestDefaultWorkloadProfile(t *testing.T) {
	if testing.Short() {
		t.Skip("replays 20,000 requests; skipped with -short")
	}
	reqs, err := workload.Generate(workload.DefaultGeneratorConfig())
	if err != nil {
		t.Fatal(err)
	}
	tr, err := replay.Compile("generated", reqs)
	if err != nil {
		t.Fatal(err)
	}
	reg := policy.NewRegistry()
	for _, register := range []func(*policy.Registry) error{lru.Register, belady.Register} {
		if err := register(reg); err != nil {
			t.Fatal(err)
		}
	}
	res, err := replay.RunPlan(context.Background(), tr, reg, replay.Plan{
		Policies:   []replay.Spec{{Name: "lru"}},
		Capacities: []int64{1e6, 3e6, 10e6},
		Belady:     true,
		Infinite:   true,
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[int64]float64{}
	for _, r := range res {
		if got[r.Policy] == nil {
			got[r.Policy] = map[int64]float64{}
		}
		got[r.Policy][r.CapacityTokens] = r.HitRate
	}
	// The figures in DefaultGeneratorConfig's documentation, ± 2 points.
	want := []struct {
		policy   string
		capacity int64
		rate     float64
	}{
		{"lru", 1e6, 0.31}, {"lru", 3e6, 0.42}, {"lru", 10e6, 0.60},
		{"belady", 1e6, 0.51}, {"belady", 3e6, 0.61}, {"belady", 10e6, 0.61},
		{"infinite", 0, 0.61},
	}
	for _, w := range want {
		r, ok := got[w.policy][w.capacity]
		if !ok {
			t.Fatalf("no result for %s at %d tokens: %v", w.policy, w.capacity, res)
		}
		if math.Abs(r-w.rate) > 0.02 {
			t.Errorf("%s at %d tokens: hit rate %.4f, documented %.2f", w.policy, w.capacity, r, w.rate)
		}
	}
	if gap := got["belady"][3e6] - got["lru"][3e6]; gap < 0.1 {
		t.Errorf("belady - lru at 3M = %.3f; the workload does not separate policies", gap)
	}
}

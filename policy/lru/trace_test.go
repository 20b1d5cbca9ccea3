package lru

import (
	"math"
	"testing"

	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/policytest"
)

// TestMooncakeAnchor checks lru against the independent simulator's figures
// on the shared synthetic trace: infinite 65.12%, 3M tokens 31.51%.
func TestMooncakeAnchor(t *testing.T) {
	reqs := policytest.SharedTrace(t, "mooncake_synthetic_trace.jsonl")
	tests := []struct {
		capacity int
		want     float64
	}{
		{-1, 0.6512},
		{3_000_000 / 512, 0.3151},
	}
	for _, tc := range tests {
		l, _ := New(policy.Options{})
		res, err := policytest.Simulate(l, reqs, tc.capacity)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(res.HitRate()-tc.want) > 0.001 {
			t.Errorf("capacity %d blocks: hit rate %.4f, want %.4f", tc.capacity, res.HitRate(), tc.want)
		}
	}
}

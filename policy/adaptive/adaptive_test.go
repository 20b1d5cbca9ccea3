package adaptive

import (
	"testing"

	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/policytest"
)

func TestConformance(t *testing.T) {
	for _, params := range []map[string]float64{nil, {"margin": 0}, {"margin": 1, "decay_shift": 1}, {"margin": MaxMargin, "decay_shift": 20}} {
		t.Run("", func(t *testing.T) {
			policytest.Run(t, func() (policy.Evictor, error) { return New(policy.Options{Params: params}) })
		})
	}
}

func TestParams(t *testing.T) {
	for _, params := range []map[string]float64{{"margin": -1}, {"margin": MaxMargin + 1}, {"share": 0.5}, {"decay_shift": 0}, {"decay_shift": 2.5}, {"decay_shift": 21}} {
		if _, err := New(policy.Options{Params: params}); err == nil {
			t.Errorf("New(%v) accepted bad parameters", params)
		}
	}
}

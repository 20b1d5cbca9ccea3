package replay

import (
	"testing"
)

// TestMachineReplaySteps replays the generated workload through the
// Machine at several step sizes: one tick a step, every request replayed,
// the same result twice, reload hits counted, and a larger step trading
// some hits for fewer ticks (requests of one step match before any of
// them inserts).
func TestMachineReplaySteps(t *testing.T) {
	tr := defaultWorkload(t)
	const requests = 3000
	hit := map[int]float64{}
	for _, tc := range []struct {
		step int
		// minHit is the least page hit rate the step should reach.
		minHit float64
	}{
		{step: 1, minHit: 0.4},
		{step: 8, minHit: 0.35},
		{step: 32, minHit: 0.3},
	} {
		cfg := MachineConfig{Requests: requests, StepRequests: tc.step}
		r, err := MachineReplay(tr, DecisionOptions(), cfg)
		if err != nil {
			t.Fatalf("step %d: %v", tc.step, err)
		}
		again, err := MachineReplay(tr, DecisionOptions(), cfg)
		if err != nil {
			t.Fatalf("step %d, again: %v", tc.step, err)
		}
		if r != again {
			t.Errorf("step %d: two replays differ:\n%+v\n%+v", tc.step, r, again)
		}
		if r.Requests != requests {
			t.Errorf("step %d: %d requests replayed, want %d", tc.step, r.Requests, requests)
		}
		if r.Ticks != r.Steps {
			t.Errorf("step %d: %d ticks in %d steps, want one a step", tc.step, r.Ticks, r.Steps)
		}
		// Held requests add a few steps at the end (a reload lands two
		// ticks after its match).
		if want := uint64((requests+tc.step-1)/tc.step) + 8; r.Steps > want {
			t.Errorf("step %d: %d steps, want at most %d", tc.step, r.Steps, want)
		}
		if r.HitPages[3] == 0 || r.Rematches == 0 {
			t.Errorf("step %d: no reload hit (%d L3 pages, %d rematches)", tc.step, r.HitPages[3], r.Rematches)
		}
		if h := r.HitRate(); h < tc.minHit {
			t.Errorf("step %d: page hit rate %.4f, want at least %.2f", tc.step, h, tc.minHit)
		}
		if r.PageEvents < 2*r.InputPages {
			t.Errorf("step %d: %d page events for %d input pages, want a match and an insert of each", tc.step, r.PageEvents, r.InputPages)
		}
		hit[tc.step] = r.HitRate()
		t.Logf("step %d: %d steps, hit rate %.4f, hits by tier %v, %d rematches", tc.step, r.Steps, r.HitRate(), r.HitPages[1:], r.Rematches)
	}
	if hit[32] > hit[1] {
		t.Errorf("a step of 32 hit %.4f, more than a step of 1 (%.4f): requests of one step should not see each other's inserts", hit[32], hit[1])
	}
}

// TestMachineReplayBadOptions: options the Machine refuses, or a negative
// step, are an error, not a replay.
func TestMachineReplayBadOptions(t *testing.T) {
	tr := defaultWorkload(t)
	noL1 := DecisionOptions()
	noL1.L1Pages = 0
	for _, tc := range []struct {
		name string
		o    func() (MachineResult, error)
	}{
		{"a Machine with no L1", func() (MachineResult, error) { return MachineReplay(tr, noL1, MachineConfig{Requests: 10}) }},
		{"a negative step", func() (MachineResult, error) {
			return MachineReplay(tr, DecisionOptions(), MachineConfig{Requests: 10, StepRequests: -1})
		}},
	} {
		if r, err := tc.o(); err == nil {
			t.Errorf("%s replayed: %+v", tc.name, r)
		}
	}
}

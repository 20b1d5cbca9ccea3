package sieve

import (
	"testing"

	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/policytest"
)

func TestConformance(t *testing.T) {
	policytest.Run(t, func() (policy.Evictor, error) { return New(policy.Options{}) })
}

func TestParams(t *testing.T) {
	if _, err := New(policy.Options{Params: map[string]float64{"x": 1}}); err == nil {
		t.Fatal("sieve accepted an unknown parameter")
	}
}

func TestSweep(t *testing.T) {
	tests := []struct {
		name string
		hits []policy.NodeID
		want []policy.NodeID
	}{
		{"fifo without hits", nil, []policy.NodeID{1, 2, 3, 4}},
		{"visited survive one pass", []policy.NodeID{1, 2}, []policy.NodeID{3, 4, 1, 2}},
		{"all visited: full pass then oldest", []policy.NodeID{1, 2, 3, 4}, []policy.NodeID{1, 2, 3, 4}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := New(policy.Options{})
			for id := policy.NodeID(1); id <= 4; id++ {
				s.Insert(policy.NodeInfo{ID: id})
				s.SetEvictable(id, true)
			}
			for _, id := range tc.hits {
				s.Hit(policy.NodeInfo{ID: id})
			}
			var got []policy.NodeID
			for {
				v, ok := s.Victim()
				if !ok {
					break
				}
				got = append(got, v)
				s.Remove(v)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("victims %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("victims %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// TestHandKeepsPosition checks the hand does not restart at the oldest
// node after an eviction: a visited node behind the hand waits a full pass.
func TestHandKeepsPosition(t *testing.T) {
	s, _ := New(policy.Options{})
	for id := policy.NodeID(1); id <= 3; id++ {
		s.Insert(policy.NodeInfo{ID: id})
		s.SetEvictable(id, true)
	}
	s.Hit(policy.NodeInfo{ID: 1})
	if v, _ := s.Victim(); v != 2 {
		t.Fatalf("victim %d, want 2", v)
	}
	s.Remove(2)
	s.Hit(policy.NodeInfo{ID: 1}) // 1 is behind the hand now
	if v, _ := s.Victim(); v != 3 {
		t.Fatalf("victim %d, want 3 (1 is behind the hand)", v)
	}
}

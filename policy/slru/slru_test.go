package slru

import (
	"testing"

	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/policytest"
)

func TestConformance(t *testing.T) {
	for _, share := range []float64{0, 0.5, DefaultProtectedShare, 1} {
		policytest.Run(t, func() (policy.Evictor, error) {
			return New(policy.Options{Params: map[string]float64{"protected_share": share}})
		})
	}
}

func TestParams(t *testing.T) {
	tests := []struct {
		params map[string]float64
		ok     bool
	}{
		{nil, true},
		{map[string]float64{"protected_share": 0.3}, true},
		{map[string]float64{"protected_share": -0.1}, false},
		{map[string]float64{"protected_share": 1.5}, false},
		{map[string]float64{"share": 0.5}, false},
	}
	for _, tc := range tests {
		_, err := New(policy.Options{Params: tc.params})
		if (err == nil) != tc.ok {
			t.Errorf("params %v: err %v, want ok=%v", tc.params, err, tc.ok)
		}
	}
}

func info(id policy.NodeID, at, hits uint64, pages int) policy.NodeInfo {
	return policy.NodeInfo{ID: id, Time: at, LastAccess: at, Hits: hits, Pages: pages}
}

func drain(s *SLRU) []policy.NodeID {
	var out []policy.NodeID
	for {
		v, ok := s.Victim()
		if !ok {
			return out
		}
		out = append(out, v)
		s.Remove(v)
	}
}

func TestOrder(t *testing.T) {
	tests := []struct {
		name  string
		share float64
		setup func(s *SLRU)
		want  []policy.NodeID
	}{
		{"probation before protected", 0.8, func(s *SLRU) {
			s.Insert(info(1, 1, 0, 1))
			s.Insert(info(2, 2, 0, 1))
			s.Insert(info(3, 3, 0, 1))
			s.Hit(info(1, 4, 1, 1))
			s.Hit(info(1, 5, 2, 1)) // protected
			s.Hit(info(2, 6, 1, 1)) // one hit: still probation
		}, []policy.NodeID{3, 2, 1}},
		{"oldest protected demoted past share", 0.5, func(s *SLRU) {
			for id := policy.NodeID(1); id <= 4; id++ {
				s.Insert(info(id, uint64(id), 0, 1))
			}
			s.Hit(info(1, 10, 2, 1))
			s.Hit(info(2, 11, 2, 1))
			s.Hit(info(3, 12, 2, 1)) // 3 of 4 pages protected > 0.5: 1 demoted
		}, []policy.NodeID{4, 1, 2, 3}},
		{"demoted node re-promoted by a hit", 0.5, func(s *SLRU) {
			for id := policy.NodeID(1); id <= 4; id++ {
				s.Insert(info(id, uint64(id), 0, 1))
			}
			s.Hit(info(1, 10, 2, 1))
			s.Hit(info(2, 11, 2, 1))
			s.Hit(info(3, 12, 2, 1)) // demotes 1
			s.Hit(info(1, 13, 3, 1)) // promotes 1, demotes 2
		}, []policy.NodeID{4, 2, 3, 1}},
		{"split keeps protection", 0.8, func(s *SLRU) {
			s.Insert(info(1, 1, 0, 4))
			s.Insert(info(2, 2, 0, 4))
			s.Hit(info(1, 3, 2, 4))
			s.Insert(info(3, 3, 2, 2)) // split off 1
			s.Update(info(1, 3, 2, 2))
		}, []policy.NodeID{2, 1, 3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(policy.Options{Params: map[string]float64{"protected_share": tc.share}})
			if err != nil {
				t.Fatal(err)
			}
			tc.setup(s)
			for id := policy.NodeID(1); id <= 4; id++ {
				s.SetEvictable(id, true)
			}
			if msg := s.Check(); msg != "" {
				t.Fatal(msg)
			}
			got := drain(s)
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

package s3fifo

import (
	"testing"

	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/policytest"
)

func TestConformance(t *testing.T) {
	for _, share := range []float64{0.05, DefaultSmallShare, 0.5} {
		policytest.Run(t, func() (policy.Evictor, error) {
			return New(policy.Options{Params: map[string]float64{"small_share": share}})
		})
	}
}

func TestParams(t *testing.T) {
	tests := []struct {
		params map[string]float64
		ok     bool
	}{
		{nil, true},
		{map[string]float64{"small_share": 0.2}, true},
		{map[string]float64{"small_share": 0}, false},
		{map[string]float64{"small_share": 1}, false},
		{map[string]float64{"ghost": 1}, false},
	}
	for _, tc := range tests {
		if _, err := New(policy.Options{Params: tc.params}); (err == nil) != tc.ok {
			t.Errorf("params %v: err %v, want ok=%v", tc.params, err, tc.ok)
		}
	}
}

func add(s *S3FIFO, id policy.NodeID, tail uint64) {
	s.Insert(policy.NodeInfo{ID: id, Pages: 1, Tail: policytest.TailHash(tail)})
	s.SetEvictable(id, true)
}

func TestScan(t *testing.T) {
	s, _ := New(policy.Options{})
	for id := policy.NodeID(1); id <= 10; id++ {
		add(s, id, uint64(id))
	}
	// All in small (100% > 10%): the oldest unhit goes first.
	s.Hit(policy.NodeInfo{ID: 1})
	if v, _ := s.Victim(); v != 2 {
		t.Fatalf("victim %d, want 2 (1 was hit and moves to main)", v)
	}
	if s.nodes.At(mustSlot(t, s, 1)).main != true {
		t.Fatal("hit node 1 was not promoted to main")
	}
	s.Remove(2)
	// Node 2's tail is a ghost: reinserting it goes straight to main.
	add(s, 11, 2)
	if !s.nodes.At(mustSlot(t, s, 11)).main {
		t.Fatal("node with a ghost tail did not enter main")
	}
	// Small still holds most pages; drain it, then main in FIFO order.
	var got []policy.NodeID
	for {
		v, ok := s.Victim()
		if !ok {
			break
		}
		got = append(got, v)
		s.Remove(v)
	}
	want := []policy.NodeID{3, 4, 5, 6, 7, 8, 9, 10, 1, 11}
	if len(got) != len(want) {
		t.Fatalf("victims %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("victims %v, want %v", got, want)
		}
	}
}

func mustSlot(t *testing.T, s *S3FIFO, id policy.NodeID) int32 {
	t.Helper()
	slot, ok := s.nodes.Lookup(id)
	if !ok {
		t.Fatalf("node %d unknown", id)
	}
	return slot
}

func TestGhostBounded(t *testing.T) {
	var g Ghost
	g.Fit(64)
	for k := uint64(0); k < 1000; k++ {
		g.Add(k)
		if g.Len() > 64 {
			t.Fatalf("ghost grew to %d entries past its capacity 64", g.Len())
		}
	}
	if g.Contains(0) || !g.Contains(999) || !g.Contains(1000-64) || g.Contains(1000-65) {
		t.Fatal("ghost does not hold exactly the newest 64 keys")
	}
	if msg := g.Check(); msg != "" {
		t.Fatal(msg)
	}
}

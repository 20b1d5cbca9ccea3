package proven

import (
	"slices"
	"testing"

	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/policytest"
)

func TestConformance(t *testing.T) {
	for _, share := range []float64{0, DefaultProtectedShare, 1} {
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
		{map[string]float64{"protected_share": 0.7}, true},
		{map[string]float64{"protected_share": -1}, false},
		{map[string]float64{"protected_share": 2}, false},
		{map[string]float64{"share": 0.5}, false},
	}
	for _, tc := range tests {
		if _, err := New(policy.Options{Params: tc.params}); (err == nil) != tc.ok {
			t.Errorf("params %v: err %v, want ok=%v", tc.params, err, tc.ok)
		}
	}
}

func info(id policy.NodeID, at, hits uint64, depth, pages int) policy.NodeInfo {
	return policy.NodeInfo{ID: id, Time: at, LastAccess: at, Hits: hits, Depth: depth, Pages: pages}
}

// step is one event of an order scenario.
type step struct {
	op string // insert, split (an Insert), hit, trim or update (an Update)
	n  policy.NodeInfo
}

func TestClassesAndOrder(t *testing.T) {
	tests := []struct {
		name    string
		share   float64
		steps   []step
		classes map[policy.NodeID]int
		victims []policy.NodeID
	}{
		{
			name:  "untouched tails go first, oldest first",
			share: 0.5,
			steps: []step{
				{op: "insert", n: info(1, 1, 0, 0, 4)},
				{op: "insert", n: info(2, 2, 0, 0, 4)},
				{op: "insert", n: info(3, 3, 0, 0, 4)},
				{op: "hit", n: info(3, 4, 1, 0, 4)},
			},
			classes: map[policy.NodeID]int{1: classUntouched, 2: classUntouched, 3: classProtected},
			victims: []policy.NodeID{1, 2, 3},
		},
		{
			name:  "a trimmed node moves to probation behind other untouched tails",
			share: 0.5,
			steps: []step{
				{op: "insert", n: info(1, 1, 0, 0, 4)},
				{op: "insert", n: info(2, 5, 0, 0, 4)},
				{op: "trim", n: info(1, 6, 0, 0, 3)},
			},
			classes: map[policy.NodeID]int{1: classProbation, 2: classUntouched},
			victims: []policy.NodeID{2, 1},
		},
		{
			name:  "a split keeps the suffix's class, the matched prefix is protected",
			share: 1,
			steps: []step{
				{op: "insert", n: info(1, 1, 0, 0, 6)},
				{op: "insert", n: info(2, 2, 0, 0, 2)},
				// 3 is the prefix split off 1, which keeps its last access.
				{op: "split", n: policy.NodeInfo{ID: 3, Time: 3, LastAccess: 1, Depth: 0, Pages: 4}},
				{op: "update", n: policy.NodeInfo{ID: 1, Time: 3, LastAccess: 1, Depth: 4, Pages: 2}},
				{op: "hit", n: info(3, 3, 1, 0, 4)},
			},
			classes: map[policy.NodeID]int{1: classUntouched, 2: classUntouched, 3: classProtected},
			victims: []policy.NodeID{1, 2, 3},
		},
		{
			name:  "protected share demotes the oldest protected",
			share: 0.5,
			steps: []step{
				{op: "insert", n: info(1, 1, 0, 0, 1)},
				{op: "insert", n: info(2, 2, 0, 0, 1)},
				{op: "insert", n: info(3, 3, 0, 0, 1)},
				{op: "insert", n: info(4, 4, 0, 0, 1)},
				{op: "hit", n: info(1, 5, 1, 0, 1)},
				{op: "hit", n: info(2, 6, 1, 0, 1)},
				{op: "hit", n: info(3, 7, 1, 0, 1)}, // 3 of 4 pages > 0.5: 1 demoted
			},
			classes: map[policy.NodeID]int{1: classProbation, 2: classProtected, 3: classProtected, 4: classUntouched},
			victims: []policy.NodeID{4, 1, 2, 3},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(policy.Options{Params: map[string]float64{"protected_share": tc.share}})
			if err != nil {
				t.Fatal(err)
			}
			var ids []policy.NodeID
			for _, s := range tc.steps {
				switch s.op {
				case "insert", "split":
					p.Insert(s.n)
					ids = append(ids, s.n.ID)
				case "hit":
					p.Hit(s.n)
				case "trim", "update":
					p.Update(s.n)
				}
				if msg := p.Check(); msg != "" {
					t.Fatalf("after %s %d: %s", s.op, s.n.ID, msg)
				}
			}
			for id, want := range tc.classes {
				if got, _ := p.Class(id); got != want {
					t.Errorf("class of %d = %d, want %d", id, got, want)
				}
			}
			for _, id := range ids {
				p.SetEvictable(id, true)
			}
			var got []policy.NodeID
			for {
				v, ok := p.Victim()
				if !ok {
					break
				}
				got = append(got, v)
				p.Remove(v)
			}
			if !slices.Equal(got, tc.victims) {
				t.Fatalf("victims %v, want %v", got, tc.victims)
			}
		})
	}
}

func TestTailRanked(t *testing.T) {
	p, _ := New(policy.Options{})
	var tr interface{ TailRanked() bool } = p
	if !tr.TailRanked() {
		t.Fatal("proven must ask for page-by-page eviction")
	}
}

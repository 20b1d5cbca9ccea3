package hindsight

import (
	"slices"
	"testing"

	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/policytest"
)

func TestConformance(t *testing.T) {
	for _, params := range []map[string]float64{
		nil,
		{"protected_share": 0},
		{"protected_share": 1, "ghost": MaxGhost},
		{"ghost": 0, "low_ratio": 0},
		{"low_ratio": 1, "ghost": 0.01},
	} {
		policytest.Run(t, func() (policy.Evictor, error) {
			return New(policy.Options{Params: params})
		})
	}
}

func TestParams(t *testing.T) {
	tests := []struct {
		params map[string]float64
		ok     bool
	}{
		{nil, true},
		{map[string]float64{"protected_share": 0.5, "ghost": 2, "low_ratio": 0.25}, true},
		{map[string]float64{"protected_share": -1}, false},
		{map[string]float64{"protected_share": 1.5}, false},
		{map[string]float64{"ghost": MaxGhost + 1}, false},
		{map[string]float64{"ghost": -0.5}, false},
		{map[string]float64{"low_ratio": 2}, false},
		{map[string]float64{"share": 0.5}, false},
	}
	for _, tc := range tests {
		if _, err := New(policy.Options{Params: tc.params}); (err == nil) != tc.ok {
			t.Errorf("params %v: err %v, want ok=%v", tc.params, err, tc.ok)
		}
	}
}

func info(id policy.NodeID, at, hits uint64, depth, pages int) policy.NodeInfo {
	return policy.NodeInfo{ID: id, Time: at, LastAccess: at, Hits: hits, Depth: depth, Pages: pages, Tail: policytest.TailHash(uint64(id)<<20 | uint64(depth+pages))}
}

// withTail returns n with the tail hash of page key k.
func withTail(n policy.NodeInfo, k uint64) policy.NodeInfo {
	n.Tail = policytest.TailHash(k)
	return n
}

// step is one event of an order scenario.
type step struct {
	op  string // insert, hit, update (trim or split suffix), remove, finished
	n   policy.NodeInfo
	out int // finished: the request's output tokens
}

// teach returns steps that make signature (root, pages) look reused or
// not: count leaves of that shape inserted under parent 1000 (below the
// root when root) at times from t0, each hit (reused) or removed unhit.
func teach(first policy.NodeID, t0 uint64, count int, root bool, pages int, reused bool) []step {
	var out []step
	for i := range count {
		id := first + policy.NodeID(i)
		depth := 0
		if !root {
			depth = 8
		}
		n := info(id, t0+uint64(i), 0, depth, pages)
		out = append(out, step{op: "insert", n: n})
		if reused {
			n.Hits, n.Time, n.LastAccess = 1, n.Time+1, n.Time+1
			out = append(out, step{op: "hit", n: n}, step{op: "remove", n: n})
		} else {
			out = append(out, step{op: "remove", n: n})
		}
	}
	return out
}

// teachOutput is teach for root leaves of 4 pages whose creating request
// is reported finished with out output tokens right after the insert.
func teachOutput(first policy.NodeID, t0 uint64, count, out int, reused bool) []step {
	var res []step
	for _, s := range teach(first, t0, count, true, 4, reused) {
		res = append(res, s)
		if s.op == "insert" {
			res = append(res, step{op: "finished", n: s.n, out: out})
		}
	}
	return res
}

func TestClassesAndOrder(t *testing.T) {
	tests := []struct {
		name    string
		params  map[string]float64
		steps   []step
		classes map[policy.NodeID]int
		victims []policy.NodeID // evictable leaves at the end, in victim order
	}{
		{
			name: "untouched tails go first, oldest first, then the rest by class",
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
			name: "a trimmed node moves to probation behind other untouched tails",
			steps: []step{
				{op: "insert", n: info(1, 1, 0, 0, 4)},
				{op: "insert", n: info(2, 5, 0, 0, 4)},
				{op: "update", n: info(1, 6, 0, 0, 3)},
			},
			classes: map[policy.NodeID]int{1: classProbation, 2: classUntouched},
			victims: []policy.NodeID{2, 1},
		},
		{
			name: "a never-reused signature starts in the low class, a reused one does not",
			steps: slices.Concat(
				teach(100, 10, 64, false, 4, false), // continuations of 4 pages: never hit
				teach(200, 200, 64, true, 4, true),  // root leaves of 4 pages: always hit
				[]step{
					{op: "insert", n: info(1, 400, 0, 8, 4)},
					{op: "update", n: info(1, 401, 0, 8, 3)}, // trimmed: no longer untouched
					{op: "insert", n: info(2, 402, 0, 0, 4)},
					{op: "update", n: info(2, 403, 0, 0, 3)},
				}),
			classes: map[policy.NodeID]int{1: classLow, 2: classProbation},
			victims: []policy.NodeID{1, 2},
		},
		{
			name: "the creating request's output length separates leaves of one shape",
			steps: slices.Concat(
				teachOutput(100, 10, 64, 2000, false), // long answers: never hit
				teachOutput(200, 200, 64, 8, true),    // short answers: always hit
				[]step{
					{op: "insert", n: info(1, 400, 0, 0, 4)},
					{op: "finished", n: info(1, 400, 0, 0, 4), out: 1500}, // same log2 bucket as 2000
					{op: "update", n: info(1, 401, 0, 0, 3)},
					{op: "insert", n: info(2, 402, 0, 0, 4)},
					{op: "finished", n: info(2, 402, 0, 0, 4), out: 9},
					{op: "update", n: info(2, 403, 0, 0, 3)},
					// Not reported: judged by the output-blind signature,
					// reused half the time like the whole workload.
					{op: "insert", n: info(3, 404, 0, 0, 4)},
					{op: "update", n: info(3, 405, 0, 0, 3)},
					// An output length never seen: its rate is the
					// output-blind signature's, not low.
					{op: "insert", n: info(4, 406, 0, 0, 4)},
					{op: "finished", n: info(4, 406, 0, 0, 4), out: 100},
					{op: "update", n: info(4, 407, 0, 0, 3)},
				}),
			classes: map[policy.NodeID]int{1: classLow, 2: classProbation, 3: classProbation, 4: classProbation},
			victims: []policy.NodeID{1, 2, 3, 4},
		},
		{
			name: "a report for a leaf that is not the request's fresh insert is ignored",
			steps: slices.Concat(
				teachOutput(100, 10, 64, 2000, false),
				teachOutput(200, 200, 64, 8, true),
				[]step{
					// Trimmed before the report: no longer untouched.
					{op: "insert", n: info(1, 400, 0, 0, 4)},
					{op: "update", n: info(1, 401, 0, 0, 3)},
					{op: "finished", n: info(1, 400, 0, 0, 3), out: 2000},
					// Matched by the request (no new pages): a hit.
					{op: "insert", n: info(2, 402, 0, 0, 4)},
					{op: "hit", n: info(2, 403, 1, 0, 4)},
					{op: "finished", n: info(2, 403, 1, 0, 4), out: 2000},
					// A report from an older time.
					{op: "insert", n: info(3, 404, 0, 0, 4)},
					{op: "finished", n: info(3, 399, 0, 0, 4), out: 2000},
					{op: "update", n: info(3, 405, 0, 0, 3)},
					// Reported twice: the second report changes nothing.
					{op: "insert", n: info(4, 406, 0, 0, 4)},
					{op: "finished", n: info(4, 406, 0, 0, 4), out: 8},
					{op: "finished", n: info(4, 406, 0, 0, 4), out: 2000},
					{op: "update", n: info(4, 407, 0, 0, 3)},
				}),
			classes: map[policy.NodeID]int{1: classProbation, 2: classProtected, 3: classProbation, 4: classProbation},
			victims: []policy.NodeID{1, 3, 4, 2},
		},
		{
			name:   "low_ratio 0 turns the low class off",
			params: map[string]float64{"low_ratio": 0},
			steps: slices.Concat(
				teach(100, 10, 64, false, 4, false),
				teach(200, 200, 64, true, 4, true),
				[]step{
					{op: "insert", n: info(1, 400, 0, 8, 4)},
					{op: "update", n: info(1, 401, 0, 8, 3)},
				}),
			classes: map[policy.NodeID]int{1: classProbation},
			victims: []policy.NodeID{1},
		},
		{
			name: "a hit lifts a node out of the low class for good",
			steps: slices.Concat(
				teach(100, 10, 64, false, 4, false),
				teach(200, 200, 64, true, 4, true),
				[]step{
					{op: "insert", n: info(9, 0, 0, 0, 20)}, // filler: room under the protected share
					{op: "insert", n: info(1, 400, 0, 8, 4)},
					{op: "hit", n: info(1, 401, 1, 8, 4)},
				}),
			classes: map[policy.NodeID]int{1: classProtected, 9: classUntouched},
			victims: []policy.NodeID{9, 1},
		},
		{
			name: "a new leaf whose tail was evicted is protected (re-fetch)",
			steps: []step{
				{op: "insert", n: withTail(info(1, 1, 0, 0, 4), 77)},
				{op: "remove", n: info(1, 2, 0, 0, 4)},  // page 77 leaves
				{op: "insert", n: info(9, 3, 0, 0, 20)}, // filler: room under the protected share
				{op: "insert", n: withTail(info(2, 3, 0, 0, 4), 77)},
				{op: "insert", n: withTail(info(3, 4, 0, 0, 4), 78)},
			},
			classes: map[policy.NodeID]int{2: classProtected, 3: classUntouched, 9: classUntouched},
			victims: []policy.NodeID{9, 3, 2},
		},
		{
			name: "a trim that exposes an evicted page protects the node",
			steps: []step{
				{op: "insert", n: withTail(info(1, 1, 0, 0, 1), 50)},
				{op: "remove", n: info(1, 2, 0, 0, 1)}, // page 50 leaves
				{op: "insert", n: withTail(info(2, 3, 0, 0, 3), 52)},
				{op: "update", n: withTail(info(2, 4, 0, 0, 2), 51)}, // 52 leaves, 51 is new
				{op: "insert", n: info(9, 5, 0, 0, 20)},              // filler: room under the protected share
				{op: "update", n: withTail(info(2, 6, 0, 0, 1), 50)}, // 50 is a ghost
			},
			classes: map[policy.NodeID]int{2: classProtected, 9: classUntouched},
			victims: []policy.NodeID{9, 2},
		},
		{
			name:   "ghost 0 remembers nothing",
			params: map[string]float64{"ghost": 0},
			steps: []step{
				{op: "insert", n: withTail(info(1, 1, 0, 0, 4), 77)},
				{op: "remove", n: info(1, 2, 0, 0, 4)},
				{op: "insert", n: withTail(info(2, 3, 0, 0, 4), 77)},
			},
			classes: map[policy.NodeID]int{2: classUntouched},
			victims: []policy.NodeID{2},
		},
		{
			name: "a split prefix inherits the signature: its hit counts for the insert",
			steps: []step{
				{op: "insert", n: info(1, 1, 0, 0, 6)},
				// 3 is the prefix split off 1 (it already has 1 as its child).
				{op: "insert", n: policy.NodeInfo{ID: 3, Time: 3, LastAccess: 1, Depth: 0, Pages: 4, Children: 1, Tail: policytest.TailHash(9)}},
				{op: "update", n: policy.NodeInfo{ID: 1, Parent: 3, Time: 3, LastAccess: 1, Depth: 4, Pages: 2, Tail: policytest.TailHash(10)}},
				{op: "hit", n: policy.NodeInfo{ID: 3, Time: 3, LastAccess: 3, Hits: 1, Depth: 0, Pages: 4, Children: 1, Tail: policytest.TailHash(9)}},
			},
			classes: map[policy.NodeID]int{1: classUntouched, 3: classProtected},
			victims: []policy.NodeID{1},
		},
		{
			name:   "protected share demotes the oldest protected",
			params: map[string]float64{"protected_share": 0.5},
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
			h, err := New(policy.Options{Params: tc.params})
			if err != nil {
				t.Fatal(err)
			}
			live := map[policy.NodeID]bool{}
			for i, s := range tc.steps {
				switch s.op {
				case "insert":
					h.Insert(s.n)
					live[s.n.ID] = true
				case "hit":
					h.Hit(s.n)
				case "update":
					h.Update(s.n)
				case "remove":
					h.Remove(s.n.ID)
					delete(live, s.n.ID)
				case "finished":
					h.Finished(policy.RequestInfo{Leaf: s.n.ID, Time: s.n.Time, OutputTokens: s.out})
				default:
					t.Fatalf("step %d: unknown op %q", i, s.op)
				}
				if msg := h.Check(); msg != "" {
					t.Fatalf("after step %d (%s %d): %s", i, s.op, s.n.ID, msg)
				}
			}
			for id, want := range tc.classes {
				if got, ok := h.Class(id); !ok || got != want {
					t.Errorf("class of %d = %d (known %t), want %d", id, got, ok, want)
				}
			}
			for _, id := range tc.victims {
				h.SetEvictable(id, true)
			}
			var got []policy.NodeID
			for {
				v, ok := h.Victim()
				if !ok {
					break
				}
				got = append(got, v)
				h.Remove(v)
			}
			if !slices.Equal(got, tc.victims) {
				t.Errorf("victims %v, want %v", got, tc.victims)
			}
		})
	}
}

func TestRemoveUnknownAndEmpty(t *testing.T) {
	h, err := New(policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h.Remove(42)
	h.SetEvictable(42, true)
	if _, ok := h.Victim(); ok {
		t.Fatal("empty policy names a victim")
	}
	if _, ok := h.Class(42); ok {
		t.Fatal("unknown id has a class")
	}
	if msg := h.Check(); msg != "" {
		t.Fatal(msg)
	}
}

// TestSplitInheritsSignature checks the learning side of a split: the
// prefix's first hit counts as one reuse of the leaf's signature, once.
func TestSplitInheritsSignature(t *testing.T) {
	h, err := New(policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	leaf := info(1, 1, 0, 0, 6)
	sig := signature(&leaf)
	h.Insert(leaf)
	h.Insert(policy.NodeInfo{ID: 3, Time: 3, LastAccess: 1, Pages: 4, Children: 1, Tail: policytest.TailHash(9)})
	h.Update(policy.NodeInfo{ID: 1, Parent: 3, Time: 3, LastAccess: 1, Depth: 4, Pages: 2, Tail: policytest.TailHash(10)})
	h.Hit(policy.NodeInfo{ID: 3, Time: 3, LastAccess: 3, Hits: 1, Pages: 4, Children: 1, Tail: policytest.TailHash(9)})
	h.Hit(policy.NodeInfo{ID: 3, Time: 5, LastAccess: 5, Hits: 2, Pages: 4, Children: 1, Tail: policytest.TailHash(9)})
	if h.inserted[sig] != 1 || h.reused[sig] != 1 || h.allIns != 1 || h.allReuse != 1 {
		t.Fatalf("signature %d: inserted %d reused %d (all %d/%d), want 1 and 1", sig, h.inserted[sig], h.reused[sig], h.allIns, h.allReuse)
	}
}

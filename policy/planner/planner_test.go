package planner

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvtier/kvtier/policy"
)

func planBoth(t *testing.T, in policy.PlanInput) (policy.Plan, policy.Plan) {
	t.Helper()
	g, err := NewGreedy().Plan(in)
	if err != nil {
		t.Fatalf("greedy: %v", err)
	}
	var first policy.Plan
	// Budget 0 rebuilds at every stale entry, a huge one never does: both
	// paths must give the greedy plan.
	for k, budget := range []int{DefaultStaleBudget, 0, 1, 1 << 30} {
		p := NewHeap()
		p.staleBudget = budget
		h, err := p.Plan(in)
		if err != nil {
			t.Fatalf("heap: %v", err)
		}
		if k == 0 {
			first = h
		} else if msg := samePlan(g, h); msg != "" {
			t.Fatalf("heap with stale budget %d: %s", budget, msg)
		}
	}
	return g, first
}

func samePlan(a, b policy.Plan) string {
	if !slices.Equal(a.Victims, b.Victims) {
		i := 0
		for i < len(a.Victims) && i < len(b.Victims) && a.Victims[i] == b.Victims[i] {
			i++
		}
		return fmt.Sprintf("victims differ at %d: greedy %v heap %v", i, a.Victims, b.Victims)
	}
	if !slices.Equal(a.Freed, b.Freed) {
		return fmt.Sprintf("freed: greedy %v heap %v", a.Freed, b.Freed)
	}
	if !slices.Equal(a.Remaining, b.Remaining) {
		return fmt.Sprintf("remaining: greedy %v heap %v", a.Remaining, b.Remaining)
	}
	return ""
}

// randomInput builds a seeded planning input: a random forest with deep
// chains, non-uniform lane counts (some nodes concentrated on one lane),
// priorities drawn from a small range so ties fall through to node ids,
// some locked nodes and children outside the input.
func randomInput(seed uint64) policy.PlanInput {
	rng := rand.New(rand.NewPCG(seed, 77))
	cp := []int{1, 2, 4, 8}[rng.IntN(4)]
	n := 1 + rng.IntN(120)
	nodes := make([]policy.PlanNode, n)
	for i := range nodes {
		nd := policy.PlanNode{ID: policy.NodeID(1000 + rng.IntN(5000)*0 + i*7 + 1), Evictable: rng.IntN(8) != 0, Counts: make([]int, cp)}
		switch rng.IntN(3) {
		case 0: // uniform by position
			nd.Counts = OwnerCounts(rng.IntN(16), 1+rng.IntN(40), cp)
		case 1: // concentrated on one lane
			nd.Counts[rng.IntN(cp)] = 1 + rng.IntN(60)
		default: // arbitrary
			for o := range nd.Counts {
				nd.Counts[o] = rng.IntN(12)
			}
		}
		nd.Priority = uint64(rng.IntN(4))
		if rng.IntN(6) == 0 {
			nd.Priority = rng.Uint64()
		}
		// Parent: an earlier node (deep chains when it is the previous one).
		if i > 0 && rng.IntN(5) != 0 {
			var p int
			if rng.IntN(3) == 0 {
				p = i - 1
			} else {
				p = rng.IntN(i)
			}
			nd.Parent = nodes[p].ID
			nodes[p].Children++
		}
		nodes[i] = nd
	}
	// Some children live outside the input.
	for i := range nodes {
		if rng.IntN(10) == 0 {
			nodes[i].Children++
		}
	}
	rng.Shuffle(len(nodes), func(i, j int) { nodes[i], nodes[j] = nodes[j], nodes[i] })
	in := policy.PlanInput{Deficits: make([]int, cp), Nodes: nodes}
	total := 0
	for _, nd := range nodes {
		for _, c := range nd.Counts {
			total += c
		}
	}
	switch rng.IntN(3) {
	case 0: // single owner
		in.Deficits[rng.IntN(cp)] = rng.IntN(total/cp + 2)
	case 1: // every lane
		for o := range in.Deficits {
			in.Deficits[o] = rng.IntN(total/cp + 2)
		}
	default: // more than everything
		for o := range in.Deficits {
			in.Deficits[o] = total + 1
		}
	}
	return in
}

// TestHeapMatchesGreedy is the property test: over 400 seeds the lazy heap
// (with several stale budgets) and the greedy reference return identical
// victims, freed pages and remaining deficits. One heap value plans every
// seed in turn, so reused scratch space is covered too.
func TestHeapMatchesGreedy(t *testing.T) {
	reused := NewHeap()
	for seed := uint64(1); seed <= 400; seed++ {
		in := randomInput(seed)
		g, h := planBoth(t, in)
		if msg := samePlan(g, h); msg != "" {
			t.Fatalf("seed %d (cp %d, %d nodes): %s", seed, len(in.Deficits), len(in.Nodes), msg)
		}
		r, err := reused.Plan(in)
		if err != nil {
			t.Fatal(err)
		}
		if msg := samePlan(g, r); msg != "" {
			t.Fatalf("seed %d: reused heap planner: %s", seed, msg)
		}
		if msg := checkPlan(in, g); msg != "" {
			t.Fatalf("seed %d: greedy plan invalid: %s", seed, msg)
		}
	}
}

// TestScenariosMatch runs the benchmark scenarios through both planners.
func TestScenariosMatch(t *testing.T) {
	for _, sc := range BenchScenarios() {
		sc.Candidates = 300
		in := sc.Build()
		g, h := planBoth(t, in)
		if msg := samePlan(g, h); msg != "" {
			t.Fatalf("%+v: %s", sc, msg)
		}
		if len(g.Victims) == 0 {
			t.Fatalf("%+v: no victims planned", sc)
		}
	}
}

// checkPlan verifies a plan against the contract independently of either
// planner: every victim is an evictable leaf when taken, freed and
// remaining add up.
func checkPlan(in policy.PlanInput, p policy.Plan) string {
	byID := map[policy.NodeID]policy.PlanNode{}
	left := map[policy.NodeID]int{}
	for _, nd := range in.Nodes {
		byID[nd.ID] = nd
		left[nd.ID] = nd.Children
	}
	freed := make([]int, len(in.Deficits))
	for _, v := range p.Victims {
		nd, ok := byID[v]
		if !ok || !nd.Evictable || left[v] != 0 {
			return fmt.Sprintf("victim %d is not an evictable leaf when taken", v)
		}
		left[v] = -1
		if _, ok := byID[nd.Parent]; ok {
			left[nd.Parent]--
		}
		for o, c := range nd.Counts {
			freed[o] += c
		}
	}
	if !slices.Equal(freed, p.Freed) {
		return fmt.Sprintf("freed %v, victims add up to %v", p.Freed, freed)
	}
	for o := range freed {
		if want := max(0, in.Deficits[o]-freed[o]); p.Remaining[o] != want {
			return fmt.Sprintf("remaining[%d] = %d, want %d", o, p.Remaining[o], want)
		}
	}
	return ""
}

func TestExplicitCases(t *testing.T) {
	one := func(c int) []int { return []int{c} }
	tests := []struct {
		name    string
		in      policy.PlanInput
		victims []policy.NodeID
		remain  []int
	}{
		{
			name: "largest contribution first",
			in: policy.PlanInput{Deficits: one(10), Nodes: []policy.PlanNode{
				{ID: 1, Evictable: true, Counts: one(3)},
				{ID: 2, Evictable: true, Counts: one(8)},
				{ID: 3, Evictable: true, Counts: one(5)},
			}},
			// After 2 the deficit is 2: 1 and 3 both contribute 2; id decides.
			victims: []policy.NodeID{2, 1}, remain: one(0),
		},
		{
			name: "capped contribution falls to priority",
			in: policy.PlanInput{Deficits: one(2), Nodes: []policy.PlanNode{
				{ID: 1, Evictable: true, Counts: one(9), Priority: 5},
				{ID: 2, Evictable: true, Counts: one(4), Priority: 1},
			}},
			victims: []policy.NodeID{2}, remain: one(0),
		},
		{
			name: "leaf-up: child then parent",
			in: policy.PlanInput{Deficits: one(20), Nodes: []policy.PlanNode{
				{ID: 1, Evictable: true, Children: 1, Counts: one(15)},
				{ID: 2, Parent: 1, Evictable: true, Counts: one(2)},
				{ID: 3, Evictable: true, Counts: one(4)},
			}},
			// 3 contributes more than 2, but 2 unlocks its parent's 15.
			victims: []policy.NodeID{3, 2, 1}, remain: one(0),
		},
		{
			name: "ancestor unlock breaks a contribution tie",
			in: policy.PlanInput{Deficits: one(4), Nodes: []policy.PlanNode{
				{ID: 1, Evictable: true, Children: 1, Counts: one(9)},
				{ID: 2, Parent: 1, Evictable: true, Counts: one(4), Priority: 9},
				{ID: 3, Evictable: true, Counts: one(4), Priority: 0},
			}},
			victims: []policy.NodeID{2}, remain: one(0),
		},
		{
			name: "locked parent never unlocked",
			in: policy.PlanInput{Deficits: one(20), Nodes: []policy.PlanNode{
				{ID: 1, Evictable: false, Children: 1, Counts: one(15)},
				{ID: 2, Parent: 1, Evictable: true, Counts: one(2)},
			}},
			victims: []policy.NodeID{2}, remain: one(18),
		},
		{
			name: "parent with a child outside the input stays",
			in: policy.PlanInput{Deficits: one(20), Nodes: []policy.PlanNode{
				{ID: 1, Evictable: true, Children: 2, Counts: one(15)},
				{ID: 2, Parent: 1, Evictable: true, Counts: one(2)},
			}},
			victims: []policy.NodeID{2}, remain: one(18),
		},
		{
			name: "useless candidates are not taken",
			in: policy.PlanInput{Deficits: []int{5, 0}, Nodes: []policy.PlanNode{
				{ID: 1, Evictable: true, Counts: []int{0, 7}},
				{ID: 2, Evictable: true, Counts: []int{3, 3}},
			}},
			victims: []policy.NodeID{2}, remain: []int{2, 0},
		},
		{
			name: "sibling gains unlock when the other sibling goes",
			in: policy.PlanInput{Deficits: one(30), Nodes: []policy.PlanNode{
				{ID: 1, Evictable: true, Children: 2, Counts: one(20)},
				{ID: 2, Parent: 1, Evictable: true, Counts: one(5)},
				{ID: 3, Parent: 1, Evictable: true, Counts: one(1), Priority: 9},
				{ID: 4, Evictable: true, Counts: one(1), Priority: 0},
			}},
			// Once 2 is gone, 3 unlocks its parent and overtakes 4 (which
			// wins on priority while 3 has no unlock); the heap must see
			// 3's score improve.
			victims: []policy.NodeID{2, 3, 1, 4}, remain: one(3),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, h := planBoth(t, tc.in)
			if msg := samePlan(g, h); msg != "" {
				t.Fatal(msg)
			}
			if !slices.Equal(g.Victims, tc.victims) || !slices.Equal(g.Remaining, tc.remain) {
				t.Fatalf("victims %v remaining %v, want %v %v", g.Victims, g.Remaining, tc.victims, tc.remain)
			}
		})
	}
}

func TestMalformedInput(t *testing.T) {
	tests := []struct {
		name string
		in   policy.PlanInput
	}{
		{"no lanes", policy.PlanInput{}},
		{"negative deficit", policy.PlanInput{Deficits: []int{-1}}},
		{"lane count mismatch", policy.PlanInput{Deficits: []int{1, 1}, Nodes: []policy.PlanNode{{ID: 1, Counts: []int{1}}}}},
		{"negative count", policy.PlanInput{Deficits: []int{1}, Nodes: []policy.PlanNode{{ID: 1, Counts: []int{-1}}}}},
		{"duplicate id", policy.PlanInput{Deficits: []int{1}, Nodes: []policy.PlanNode{{ID: 1, Counts: []int{1}}, {ID: 1, Counts: []int{1}}}}},
		{"more children than reported", policy.PlanInput{Deficits: []int{1}, Nodes: []policy.PlanNode{{ID: 1, Counts: []int{1}}, {ID: 2, Parent: 1, Counts: []int{1}}}}},
	}
	for _, tc := range tests {
		for _, name := range Names() {
			p, _ := ByName(name)
			if _, err := p.Plan(tc.in); !errors.Is(err, ErrInput) {
				t.Errorf("%s %s: err %v, want ErrInput", name, tc.name, err)
			}
		}
	}
}

func TestByName(t *testing.T) {
	for _, n := range Names() {
		p, err := ByName(n)
		if err != nil || p.Name() != n {
			t.Fatalf("ByName(%q) = %v, %v", n, p, err)
		}
	}
	if _, err := ByName("fifo"); !errors.Is(err, ErrUnknown) {
		t.Fatalf("ByName(fifo): %v, want ErrUnknown", err)
	}
}

func TestOwnerCounts(t *testing.T) {
	tests := []struct {
		depth, pages, cp int
		want             []int
	}{
		{0, 8, 4, []int{2, 2, 2, 2}},
		{1, 5, 4, []int{1, 2, 1, 1}},
		{3, 2, 4, []int{1, 0, 0, 1}},
		{0, 7, 1, []int{7}},
		{5, 0, 2, []int{0, 0}},
	}
	for _, tc := range tests {
		if got := OwnerCounts(tc.depth, tc.pages, tc.cp); !slices.Equal(got, tc.want) {
			t.Errorf("OwnerCounts(%d, %d, %d) = %v, want %v", tc.depth, tc.pages, tc.cp, got, tc.want)
		}
	}
}

// FuzzHeapMatchesGreedy extends the property test to fuzzer-chosen seeds.
func FuzzHeapMatchesGreedy(f *testing.F) {
	for _, s := range []uint64{1, 2, 77, 1 << 40} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, seed uint64) {
		in := randomInput(seed)
		g, h := planBoth(t, in)
		if msg := samePlan(g, h); msg != "" {
			t.Fatalf("seed %d: %s", seed, msg)
		}
	})
}

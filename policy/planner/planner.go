// Package planner holds the Planner v1 implementations: greedy, the
// reference that rescans every candidate for each victim and is kept as the
// oracle, and heap, a leaf-up min-heap with lazy re-evaluation that returns
// the same plan in a fraction of the time. ByName selects one for the stack
// config's `planner: heap|greedy`.
//
// Both are pure functions of their input (replicated state only); the
// package must never read a clock, a random source or rank-local state.
package planner

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"

	"github.com/kvtier/kvtier/policy"
)

// Default is the planner a stack uses when its config names none.
const Default = "heap"

// ErrUnknown is returned by ByName for a name that is not a planner.
var ErrUnknown = errors.New("unknown planner")

// ErrInput marks malformed planning input.
var ErrInput = errors.New("malformed plan input")

// Names returns the planner names ByName accepts, sorted.
func Names() []string { return []string{"greedy", "heap"} }

// ByName returns a fresh planner by name.
func ByName(name string) (policy.Planner, error) {
	switch name {
	case "greedy":
		return NewGreedy(), nil
	case "heap":
		return NewHeap(), nil
	}
	return nil, fmt.Errorf("planner %q: %w (known: %v)", name, ErrUnknown, Names())
}

// Register adds the built-in planners, greedy and heap, to r under
// policy.PlannerV1.
func Register(r *policy.PlannerRegistry) error {
	for _, reg := range []policy.PlannerRegistration{
		{Type: policy.PlannerV1, Name: "greedy", Doc: "rescans the candidates for each victim (the reference)",
			Factory: func() policy.Planner { return NewGreedy() }},
		{Type: policy.PlannerV1, Name: "heap", Doc: "pops victims from a heap ordered like greedy's scan (the default)",
			Factory: func() policy.Planner { return NewHeap() }},
	} {
		if err := r.Register(reg); err != nil {
			return fmt.Errorf("planner %s: %w", reg.Name, err)
		}
	}
	return nil
}

// OwnerCounts returns, for a node of pages pages starting at page index
// depth, how many pages each of cpSize owner lanes holds (owner(i) =
// i mod cpSize). Callers compute it once per node per planning call.
func OwnerCounts(depth, pages, cpSize int) []int {
	c := make([]int, cpSize)
	if cpSize <= 0 || pages <= 0 {
		return c
	}
	full := pages / cpSize
	for o := range c {
		c[o] = full
	}
	for i := depth + full*cpSize; i < depth+pages; i++ {
		c[i%cpSize]++
	}
	return c
}

// graph is the validated, index-addressed form of a PlanInput shared by
// both planners.
type graph struct {
	lanes  int
	nodes  []policy.PlanNode
	parent []int32 // index of the parent in nodes, -1 if absent
	left   []int   // children not yet planned away
	// kidsIn counts each node's children present in the input; kidXor
	// is the XOR of (index + 1) over its children not yet planned, so when
	// one is left, kidXor names it (0: the one left is not in the input).
	kidsIn  []int32
	kidXor  []int32
	deficit []int
	freed   []int
	taken   []bool
	index   idIndex
}

// idIndex maps node ids to input indexes for one planning call: open
// addressing with linear probing and a generation stamp, so a new call
// reuses the table without clearing it. It is the planner's largest fixed
// cost, which both planners share.
type idIndex struct {
	slots []idSlot
	shift uint
	gen   uint32
}

type idSlot struct {
	id  policy.NodeID
	idx int32
	gen uint32
}

// reset prepares the index for n ids.
func (x *idIndex) reset(n int) {
	size := 16
	for size < 2*n {
		size <<= 1
	}
	x.gen++
	if size > len(x.slots) || x.gen == 0 {
		x.slots = make([]idSlot, size)
		x.gen = 1
	}
	x.shift = uint(64 - bits.TrailingZeros(uint(len(x.slots))))
}

func (x *idIndex) home(id policy.NodeID) int {
	return int((uint64(id) * 0x9e3779b97f4a7c15) >> x.shift)
}

// insert adds id at idx; it reports false when id is already present.
func (x *idIndex) insert(id policy.NodeID, idx int32) bool {
	mask := len(x.slots) - 1
	for i := x.home(id); ; i = (i + 1) & mask {
		s := &x.slots[i]
		if s.gen != x.gen {
			*s = idSlot{id: id, idx: idx, gen: x.gen}
			return true
		}
		if s.id == id {
			return false
		}
	}
}

// lookup returns id's index, or -1.
func (x *idIndex) lookup(id policy.NodeID) int32 {
	mask := len(x.slots) - 1
	for i := x.home(id); ; i = (i + 1) & mask {
		s := &x.slots[i]
		if s.gen != x.gen {
			return -1
		}
		if s.id == id {
			return s.idx
		}
	}
}

func (g *graph) build(in policy.PlanInput) error {
	g.lanes = len(in.Deficits)
	if g.lanes == 0 {
		return fmt.Errorf("%w: no owner lanes (empty deficits)", ErrInput)
	}
	for o, d := range in.Deficits {
		if d < 0 {
			return fmt.Errorf("%w: deficit of lane %d is negative (%d)", ErrInput, o, d)
		}
	}
	n := len(in.Nodes)
	g.nodes = in.Nodes
	g.parent = resize(g.parent, n)
	g.left = resize(g.left, n)
	g.taken = resize(g.taken, n)
	g.kidsIn = resize(g.kidsIn, n)
	g.kidXor = resize(g.kidXor, n)
	g.deficit = append(g.deficit[:0], in.Deficits...)
	g.freed = resize(g.freed, g.lanes)
	clear(g.freed)
	clear(g.taken)
	clear(g.kidsIn)
	clear(g.kidXor)
	g.index.reset(n)
	for i, nd := range in.Nodes {
		if len(nd.Counts) != g.lanes {
			return fmt.Errorf("%w: node %d has %d lane counts, deficits have %d", ErrInput, nd.ID, len(nd.Counts), g.lanes)
		}
		for o, c := range nd.Counts {
			if c < 0 {
				return fmt.Errorf("%w: node %d lane %d count is negative (%d)", ErrInput, nd.ID, o, c)
			}
		}
		if nd.Children < 0 {
			return fmt.Errorf("%w: node %d has %d children", ErrInput, nd.ID, nd.Children)
		}
		if !g.index.insert(nd.ID, int32(i)) {
			return fmt.Errorf("%w: node %d appears twice", ErrInput, nd.ID)
		}
		g.left[i] = nd.Children
	}
	for i, nd := range in.Nodes {
		p := int32(-1)
		if nd.Parent != 0 {
			p = g.index.lookup(nd.Parent)
		}
		g.parent[i] = p
		if p >= 0 {
			g.kidsIn[p]++
			g.kidXor[p] ^= int32(i + 1)
			if int(g.kidsIn[p]) > in.Nodes[p].Children {
				return fmt.Errorf("%w: node %d has more children in the input than the %d it reports", ErrInput, in.Nodes[p].ID, in.Nodes[p].Children)
			}
		}
	}
	return nil
}

func resize[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}

func (g *graph) candidate(i int) bool {
	return !g.taken[i] && g.nodes[i].Evictable && g.left[i] == 0
}

func (g *graph) contribution(i int) int {
	c := 0
	for o, k := range g.nodes[i].Counts {
		c += min(k, g.deficit[o])
	}
	return c
}

// unlock is the contribution evicting candidate i makes reachable through
// its parent: the parent's, when i is its last unplanned child.
func (g *graph) unlock(i int) int {
	p := g.parent[i]
	if p < 0 || g.left[p] != 1 || !g.nodes[p].Evictable || g.taken[p] {
		return 0
	}
	return g.contribution(int(p))
}

func (g *graph) met() bool {
	for _, d := range g.deficit {
		if d > 0 {
			return false
		}
	}
	return true
}

// score is a candidate's planning order; less is evicted first.
type score struct {
	contrib  int
	unlock   int
	priority uint64
	id       policy.NodeID
}

func (g *graph) score(i int) score {
	return score{g.contribution(i), g.unlock(i), g.nodes[i].Priority, g.nodes[i].ID}
}

func (a score) less(b score) bool {
	if a.contrib != b.contrib {
		return a.contrib > b.contrib
	}
	if a.unlock != b.unlock {
		return a.unlock > b.unlock
	}
	if a.priority != b.priority {
		return a.priority < b.priority
	}
	return a.id < b.id
}

// take plans node i away and returns its parent's index when the parent
// just became a candidate (else -1).
func (g *graph) take(i int, victims *[]policy.NodeID) int {
	g.taken[i] = true
	*victims = append(*victims, g.nodes[i].ID)
	for o, k := range g.nodes[i].Counts {
		g.freed[o] += k
		g.deficit[o] = max(0, g.deficit[o]-k)
	}
	p := g.parent[i]
	if p < 0 {
		return -1
	}
	g.left[p]--
	g.kidXor[p] ^= int32(i + 1)
	if g.candidate(int(p)) {
		return int(p)
	}
	return -1
}

func (g *graph) result(victims []policy.NodeID) policy.Plan {
	return policy.Plan{
		Victims:   victims,
		Freed:     slices.Clone(g.freed),
		Remaining: slices.Clone(g.deficit),
	}
}

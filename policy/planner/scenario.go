package planner

import (
	"math/rand/v2"

	"github.com/kvtier/kvtier/policy"
)

// Scenario describes a synthetic planning call shaped like a production
// one that made the Python predecessor's planner hang for seconds: many
// evictable leaves of tens of pages under a forest of shared prefixes,
// with an owner-lane deficit.
type Scenario struct {
	// Seed makes the scenario reproducible.
	Seed uint64
	// Candidates is the number of evictable leaves.
	Candidates int
	// CPSize is the number of owner lanes.
	CPSize int
	// Deficit is the pages lane 0 must free; with AllLanes every lane
	// must free Deficit/CPSize.
	Deficit int
	// AllLanes spreads the deficit over every lane.
	AllLanes bool
}

// Build returns the scenario's planning input. Nodes hold 1-32 pages (2,000
// leaves then hold about 33,000 pages, the size of a 31,507-page owner
// lane seen in production, and about 200 of them cover a 7,877-page
// deficit, as in that case); one leaf in four hangs under an evictable
// parent (itself possibly under another), so planning unlocks ancestors;
// priorities are last-access times with an slru-style protected bit on one
// node in five.
func (s Scenario) Build() policy.PlanInput {
	rng := rand.New(rand.NewPCG(s.Seed, 0x5eed))
	in := policy.PlanInput{Deficits: make([]int, s.CPSize)}
	if s.AllLanes {
		for o := range in.Deficits {
			in.Deficits[o] = s.Deficit / s.CPSize
		}
	} else {
		in.Deficits[0] = s.Deficit
	}
	next := policy.NodeID(1)
	node := func(parent *policy.PlanNode, depth int) policy.PlanNode {
		pages := 1 + rng.IntN(32)
		prio := rng.Uint64N(1 << 40)
		if rng.IntN(5) == 0 {
			prio |= 1 << 63
		}
		n := policy.PlanNode{ID: next, Evictable: rng.IntN(10) != 0, Counts: OwnerCounts(depth, pages, s.CPSize), Priority: prio}
		next++
		if parent != nil {
			n.Parent = parent.ID
		}
		return n
	}
	leaves := 0
	for leaves < s.Candidates {
		if rng.IntN(4) != 0 {
			leaf := node(nil, 0)
			leaf.Evictable = true
			in.Nodes = append(in.Nodes, leaf)
			leaves++
			continue
		}
		// A small subtree: an internal chain of 1-3 nodes with 1-4 leaves.
		depth := 0
		var chain []int
		for k := 1 + rng.IntN(3); k > 0; k-- {
			var parent *policy.PlanNode
			if len(chain) > 0 {
				parent = &in.Nodes[chain[len(chain)-1]]
			}
			n := node(parent, depth)
			n.Children = 1
			depth += n.Counts[0]*s.CPSize + 1
			in.Nodes = append(in.Nodes, n)
			chain = append(chain, len(in.Nodes)-1)
		}
		top := &in.Nodes[chain[len(chain)-1]]
		top.Children = 1 + rng.IntN(4)
		for k := top.Children; k > 0 && leaves < s.Candidates; k-- {
			leaf := node(&in.Nodes[chain[len(chain)-1]], depth)
			leaf.Evictable = true
			in.Nodes = append(in.Nodes, leaf)
			leaves++
		}
		// Fewer leaves than announced (the candidate budget ran out): the
		// rest are children outside the input, so the chain stays put.
	}
	return in
}

package planner

import "github.com/kvtier/kvtier/policy"

// Greedy is the reference planner: after every victim it rescans all
// candidates for the least score. It is O(victims × candidates × lanes) and
// is kept as the oracle the heap planner is tested against.
type Greedy struct {
	g     graph
	cands []int
}

// NewGreedy returns a greedy planner.
func NewGreedy() *Greedy { return &Greedy{} }

// Name returns "greedy".
func (p *Greedy) Name() string { return "greedy" }

// Plan computes the victims for in by full rescans.
func (p *Greedy) Plan(in policy.PlanInput) (policy.Plan, error) {
	g := &p.g
	if err := g.build(in); err != nil {
		return policy.Plan{}, err
	}
	p.cands = p.cands[:0]
	for i := range g.nodes {
		if g.candidate(i) {
			p.cands = append(p.cands, i)
		}
	}
	var victims []policy.NodeID
	for !g.met() && len(p.cands) > 0 {
		best, bestScore := -1, score{}
		for k, i := range p.cands {
			if s := g.score(i); best < 0 || s.less(bestScore) {
				best, bestScore = k, s
			}
		}
		if bestScore.contrib == 0 && bestScore.unlock == 0 {
			break
		}
		i := p.cands[best]
		p.cands[best] = p.cands[len(p.cands)-1]
		p.cands = p.cands[:len(p.cands)-1]
		if parent := g.take(i, &victims); parent >= 0 {
			p.cands = append(p.cands, parent)
		}
	}
	return g.result(victims), nil
}

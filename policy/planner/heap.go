package planner

import "github.com/kvtier/kvtier/policy"

// Heap is the fast planner: a leaf-up min-heap of candidates with lazy
// re-evaluation. A popped entry is used only if its score is still the
// node's current score; otherwise it is pushed back with the fresh score.
// Stale scores are optimistic — a contribution and an ancestor unlock only
// shrink as the deficits shrink — so the first current entry popped is the
// global argmin the greedy rescan would pick, and both planners return the
// same plan. The one change that can make a score better, a candidate
// becoming its parent's last unplanned child (its unlock appears), pushes a
// fresh entry for it at that moment.
type Heap struct {
	g    graph
	h    []heapEntry
	seen []bool
	// staleBudget is how many stale entries may be refreshed one at a
	// time between two victims before the heap is rebuilt with fresh
	// scores in one O(n) pass. When a deficit falls below many
	// candidates' counts, all their contributions drop to the same value
	// at once; refreshing them one by one would cost O(k log n).
	staleBudget int
}

// DefaultStaleBudget is the heap planner's default number of one-by-one
// refreshes between victims before a full rebuild.
const DefaultStaleBudget = 8

// heapEntry holds a score packed for fast comparison: key orders by
// (-contribution, -unlock) in one word, then priority, then id.
type heapEntry struct {
	key      uint64
	priority uint64
	id       policy.NodeID
	idx      int32
}

func entryOf(s score, idx int) heapEntry {
	return heapEntry{key: packScore(s), priority: s.priority, id: s.id, idx: int32(idx)}
}

// packScore folds (-contribution, -unlock) into one word. Both are page
// counts below 2^32 (a plan bigger than that is not a cache).
func packScore(s score) uint64 {
	c := uint64(min(s.contrib, 1<<32-1))
	u := uint64(min(s.unlock, 1<<32-1))
	return ^(c<<32 | u)
}

func (a *heapEntry) less(b *heapEntry) bool {
	if a.key != b.key {
		return a.key < b.key
	}
	if a.priority != b.priority {
		return a.priority < b.priority
	}
	return a.id < b.id
}

// NewHeap returns a heap planner.
func NewHeap() *Heap { return &Heap{staleBudget: DefaultStaleBudget} }

// Name returns "heap".
func (p *Heap) Name() string { return "heap" }

// Plan computes the victims for in.
func (p *Heap) Plan(in policy.PlanInput) (policy.Plan, error) {
	g := &p.g
	if err := g.build(in); err != nil {
		return policy.Plan{}, err
	}
	p.h = p.h[:0]
	for i := range g.nodes {
		if g.candidate(i) {
			p.h = append(p.h, entryOf(g.score(i), i))
		}
	}
	for i := len(p.h)/2 - 1; i >= 0; i-- {
		p.down(i)
	}
	var victims []policy.NodeID
	stale := 0
	for !g.met() && len(p.h) > 0 {
		e := p.h[0]
		i := int(e.idx)
		if g.taken[i] {
			p.pop()
			continue
		}
		if k := packScore(g.score(i)); k != e.key {
			if stale++; stale > p.staleBudget {
				p.rebuild()
				stale = 0
				continue
			}
			p.h[0].key = k
			p.down(0)
			continue
		}
		stale = 0
		if e.key == ^uint64(0) { // zero contribution, zero unlock
			break
		}
		p.pop()
		parent := g.take(i, &victims)
		if parent >= 0 {
			p.push(entryOf(g.score(parent), parent))
		} else if pi := g.parent[i]; pi >= 0 && g.left[pi] == 1 {
			// The parent's last unplanned child now unlocks it: its score
			// improved, so its old entry is no longer optimistic.
			if c := int(g.kidXor[pi]) - 1; c >= 0 && g.candidate(c) {
				p.push(entryOf(g.score(c), c))
			}
		}
	}
	return g.result(victims), nil
}

// rebuild drops taken and duplicate entries, rescores the rest and
// re-heapifies: afterwards every entry is current.
func (p *Heap) rebuild() {
	g := &p.g
	p.seen = resize(p.seen, len(g.nodes))
	clear(p.seen)
	k := 0
	for _, e := range p.h {
		i := int(e.idx)
		if g.taken[i] || p.seen[i] {
			continue
		}
		p.seen[i] = true
		p.h[k] = entryOf(g.score(i), i)
		k++
	}
	p.h = p.h[:k]
	for i := len(p.h)/2 - 1; i >= 0; i-- {
		p.down(i)
	}
}

func (p *Heap) push(e heapEntry) {
	p.h = append(p.h, e)
	i := len(p.h) - 1
	for i > 0 {
		up := (i - 1) / 2
		if !p.h[i].less(&p.h[up]) {
			break
		}
		p.h[i], p.h[up] = p.h[up], p.h[i]
		i = up
	}
}

func (p *Heap) pop() {
	last := len(p.h) - 1
	p.h[0] = p.h[last]
	p.h = p.h[:last]
	if last > 0 {
		p.down(0)
	}
}

func (p *Heap) down(i int) {
	n := len(p.h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && p.h[r].less(&p.h[l]) {
			m = r
		}
		if !p.h[m].less(&p.h[i]) {
			return
		}
		p.h[i], p.h[m] = p.h[m], p.h[i]
		i = m
	}
}

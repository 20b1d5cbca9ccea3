// Package proven is kvtier's gap-closing eviction policy: a segmented LRU
// in which protection is earned by proven reuse, and a leaf that was never
// reused gives up its tail page before anything else is touched.
//
// Three classes order the evictable leaves, each by (last access, node id):
//
//  0. untouched — never matched (hit count 0) and not yet trimmed. Only the
//     tail page goes from this class: the node moves to class 1 as soon as
//     the tree trims it. A request's last page is the page least likely to
//     be asked for again (it ends on a partial block or on tokens no later
//     prompt repeats), so every untouched leaf pays one page first.
//  1. probation — the rest of a never-matched node, and protected nodes
//     demoted for lack of room.
//  2. protected — matched at least once (hit count >= 1). Protected nodes
//     may hold at most Params["protected_share"] (default 0.5) of the
//     cached pages; past it, the protected nodes with the oldest last
//     access are demoted to probation until the share holds. A hit promotes
//     a demoted node again.
//
// The policy asks the tree to free its victims page by page (TailRanked),
// so class 0 costs exactly one page per leaf. Every input is a replicated
// event (node id, logical time, hit count, pages, depth); the package must
// never read a wall clock, a random source or rank-local state, and it
// keeps no history of evicted nodes. The order, the protected segment and
// its demotions are the segmented-LRU core shared with slru and hindsight
// (policy/internal/segmented); this package decides the classes.
//
// Memory: per live node one map entry (id to slot), 32 bytes of state, a
// 32-byte heap entry and a 4-byte position while it is an evictable leaf,
// and another 36 bytes while protected. Nothing outlives a node.
package proven

import (
	"fmt"

	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/internal/segmented"
)

// Name is the registered name of the policy.
const Name = "proven"

// DefaultProtectedShare is the default largest share of cached pages held
// by protected (reused) nodes.
const DefaultProtectedShare = 0.5

// Classes of the victim order; lower is evicted first.
const (
	classUntouched = 0
	classProbation = 1
	classProtected = 2
)

// Register adds proven to r.
func Register(r *policy.Registry) error {
	return r.Register(policy.Registration{
		Type:    policy.EvictorV1,
		Name:    Name,
		Doc:     "segmented LRU protected by proven reuse; never-reused leaves give up their tail page first",
		Factory: func(opts policy.Options) (policy.Evictor, error) { return New(opts) },
	})
}

// node is proven's own state of a node; pages, last access and protection
// are the core's.
type node struct {
	depth     int
	untouched bool
}

// class is the victim class of an unprotected node.
func class(v *node) uint64 {
	if v.untouched {
		return classUntouched
	}
	return classProbation
}

// Proven is the proven Evictor. Use New.
type Proven struct {
	core *segmented.LRU[node]
}

// New returns an empty Proven. It accepts Params["protected_share"] in
// [0, 1].
func New(opts policy.Options) (*Proven, error) {
	if err := policy.CheckParams(Name, opts.Params, "protected_share"); err != nil {
		return nil, fmt.Errorf("new proven: %w", err)
	}
	share, err := policy.RangeParam(opts.Params, "protected_share", DefaultProtectedShare, 1)
	if err != nil {
		return nil, fmt.Errorf("new proven: %w", err)
	}
	return &Proven{core: segmented.New(share, classProtected, class)}, nil
}

// Name returns "proven".
func (p *Proven) Name() string { return Name }

// TailRanked asks the radix tree to free this policy's victims one page at
// a time (radix.TailRanker): a trim moves an untouched leaf to probation,
// so the next page of that leaf is ranked again.
func (p *Proven) TailRanked() bool { return true }

// Insert records a new node. A node split off a matched one carries its
// hit count and starts protected; a node with no hits starts untouched.
func (p *Proven) Insert(n policy.NodeInfo) {
	slot, fresh := p.core.Add(n.ID)
	if !fresh {
		p.Update(n)
		return
	}
	v := p.core.At(slot)
	v.untouched = n.Hits == 0
	v.depth = n.Depth
	p.core.Apply(slot, n.ID, n.Pages, n.LastAccess, n.Hits >= 1)
}

// Hit refreshes n and protects it: it has proven reuse.
func (p *Proven) Hit(n policy.NodeInfo) {
	slot, _ := p.core.Add(n.ID)
	v := p.core.At(slot)
	v.untouched = false
	v.depth = n.Depth
	p.core.Apply(slot, n.ID, n.Pages, max(n.LastAccess, n.Time), true)
}

// Update takes n's new pages, depth and last access. A node that lost
// pages at an unchanged depth was trimmed from its tail: it is no longer
// untouched. (A split moves the suffix deeper and keeps its class.)
func (p *Proven) Update(n policy.NodeInfo) {
	slot, fresh := p.core.Add(n.ID)
	v := p.core.At(slot)
	if fresh {
		v.untouched = n.Hits == 0
	} else if n.Depth == v.depth && int64(n.Pages) < p.core.Pages(slot) {
		v.untouched = false
	}
	v.depth = n.Depth
	p.core.Apply(slot, n.ID, n.Pages, n.LastAccess, fresh && n.Hits >= 1)
}

// Remove forgets id.
func (p *Proven) Remove(id policy.NodeID) { p.core.Remove(id) }

// SetEvictable adds id to or removes it from the candidates. Unknown ids
// are ignored.
func (p *Proven) SetEvictable(id policy.NodeID, evictable bool) { p.core.SetEvictable(id, evictable) }

// Victim returns the least evictable leaf in (class, last access, id).
func (p *Proven) Victim() (policy.NodeID, bool) { return p.core.Victim() }

// Class returns id's current class (0 untouched, 1 probation, 2
// protected) and whether id is known; for tests and inspection.
func (p *Proven) Class(id policy.NodeID) (int, bool) { return p.core.Class(id) }

// Check verifies the internal invariants; "" when they hold.
func (p *Proven) Check() string { return p.core.Check() }

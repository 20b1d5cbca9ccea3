package radix

import (
	"fmt"
	"slices"

	"github.com/kvtier/kvtier/policy"
)

// EvictableLister is an optional ability of an evictor: listing the nodes
// it currently holds as evictable, in any order. When the evictor has it,
// Check also verifies that the evictor's evictable set equals the tree's.
type EvictableLister interface {
	Evictable() []policy.NodeID
}

// SelfChecker is an optional ability of an evictor: Check verifies the
// evictor's own internal invariants and returns "" when they hold. The
// tree's Check calls it, so invariant builds cover the policy too.
type SelfChecker interface {
	Check() string
}

// Check verifies the tree's invariants and returns the first violation,
// naming what was expected and what was found: key length = pages = hashes
// (and tokens / page_tokens), parent/child links and depths, lock refs
// never negative and never below the sum of the children's, residency
// naming only configured tiers and per-tier page counts equal to the sum
// over nodes, node ids unique and below the next id, the evictable flags
// equal to "leaf, no lock, no backup pending", and the evictor's
// evictable set equal to the tree's when the evictor can list it, and the
// evictor's own invariants when it can check them (SelfChecker).
//
// Check costs O(nodes + pages); builds with the invariants tag run it
// after mutating calls (see checkSampled).
func (t *Tree) Check() error {
	c := checker{t: t, seen: make(map[policy.NodeID]bool, t.byID.Len())}
	if t.root.id != 0 || t.root.parent != nil || len(t.root.hashes) != 0 {
		return fmt.Errorf("radix invariant: root must be id 0 with no parent and no pages, found id %d, %d pages", t.root.id, len(t.root.hashes))
	}
	if _, err := c.node(t.root); err != nil {
		return err
	}
	if c.pages != t.pages {
		return fmt.Errorf("radix invariant: tree counts %d pages, nodes hold %d", t.pages, c.pages)
	}
	if c.tierPages != t.tierPages {
		return fmt.Errorf("radix invariant: per-tier page counts %v, nodes hold %v", t.tierPages, c.tierPages)
	}
	if len(c.seen) != t.byID.Len() {
		return fmt.Errorf("radix invariant: id table has %d nodes, tree reaches %d", t.byID.Len(), len(c.seen))
	}
	if sc, ok := t.ev.(SelfChecker); ok {
		if msg := sc.Check(); msg != "" {
			return fmt.Errorf("radix invariant: evictor %s: %s", t.ev.Name(), msg)
		}
	}
	if l, ok := t.ev.(EvictableLister); ok {
		got := l.Evictable()
		slices.Sort(got)
		slices.Sort(c.evictable)
		if !slices.Equal(got, c.evictable) {
			return fmt.Errorf("radix invariant: evictor %s holds evictable %v, tree has %v", t.ev.Name(), got, c.evictable)
		}
	}
	return nil
}

type checker struct {
	t         *Tree
	seen      map[policy.NodeID]bool
	pages     int
	tierPages [MaxTiers]int
	evictable []policy.NodeID
}

// node checks n's subtree and returns n's lock refs.
func (c *checker) node(n *Node) (int32, error) {
	t := c.t
	if n != t.root {
		if len(n.hashes) == 0 {
			return 0, fmt.Errorf("radix invariant: node %d has no pages", n.id)
		}
		if n.tokens != nil && len(n.tokens) != len(n.hashes)*t.opts.PageTokens {
			return 0, fmt.Errorf("radix invariant: node %d has %d pages (hashes) but %d tokens, want %d",
				n.id, len(n.hashes), len(n.tokens), len(n.hashes)*t.opts.PageTokens)
		}
		if n.id == 0 || n.id >= t.nextID {
			return 0, fmt.Errorf("radix invariant: node id %d outside 1..%d", n.id, t.nextID-1)
		}
		if c.seen[n.id] {
			return 0, fmt.Errorf("radix invariant: node id %d appears twice", n.id)
		}
		c.seen[n.id] = true
		if t.byID.Get(n.id) != n {
			return 0, fmt.Errorf("radix invariant: id table entry of node %d is not the node in the tree", n.id)
		}
		if n.removed {
			return 0, fmt.Errorf("radix invariant: removed node %d is still in the tree", n.id)
		}
		if want := n.parent.depth + len(n.parent.hashes); n.depth != want {
			return 0, fmt.Errorf("radix invariant: node %d depth %d, parent %d ends at page %d", n.id, n.depth, n.parent.id, want)
		}
		if n.parent.child(&n.hashes[0]) != n {
			return 0, fmt.Errorf("radix invariant: parent %d does not find node %d by its first page %s", n.parent.id, n.id, n.hashes[0].Short())
		}
		if err := t.opts.checkResidency(n.residency); err != nil {
			return 0, fmt.Errorf("radix invariant: node %d: %w", n.id, err)
		}
		if n.lockRefs < 0 {
			return 0, fmt.Errorf("radix invariant: node %d has negative lock refs %d", n.id, n.lockRefs)
		}
		c.pages += len(n.hashes)
		for i := range t.opts.Tiers {
			if n.residency&(1<<i) != 0 {
				c.tierPages[i] += len(n.hashes)
			}
		}
		want := n.IsLeaf() && n.lockRefs == 0 && !n.backupPending
		if n.evictable != want {
			return 0, fmt.Errorf("radix invariant: node %d reported evictable=%t, want %t (leaf %t, locks %d, backup pending %t)",
				n.id, n.evictable, want, n.IsLeaf(), n.lockRefs, n.backupPending)
		}
		if want {
			c.evictable = append(c.evictable, n.id)
		}
	}
	if n.kidMap != nil && n.kids != nil {
		return 0, fmt.Errorf("radix invariant: node %d has both a child list and a child map", n.id)
	}
	var sum int32
	visit := func(k *Node) error {
		if k.parent != n {
			return fmt.Errorf("radix invariant: child %d of node %d names parent %v", k.id, n.id, idOf(k.parent))
		}
		refs, err := c.node(k)
		sum += refs
		return err
	}
	// NB: map order is fine here: the first violation found may vary,
	// never whether there is one.
	for _, k := range n.kids {
		if err := visit(k); err != nil {
			return 0, err
		}
	}
	for _, k := range n.kidMap {
		if err := visit(k); err != nil {
			return 0, err
		}
	}
	for _, k := range n.kidClash {
		if err := visit(k); err != nil {
			return 0, err
		}
	}
	if n != t.root && n.lockRefs < sum {
		return 0, fmt.Errorf("radix invariant: node %d has %d lock refs, below its children's %d", n.id, n.lockRefs, sum)
	}
	return n.lockRefs, nil
}

func idOf(n *Node) any {
	if n == nil {
		return "nil"
	}
	return n.id
}

package radix

import (
	"slices"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
)

// kidListMax is how many children a node keeps in a slice before it
// switches to a map keyed by first page hash: most nodes have zero or one
// child, and a short linear scan beats a map there.
const kidListMax = 8

// Node is one radix-tree node: a run of whole pages under one parent.
//
// A *Node stays valid while the node is in the tree; after it is evicted
// whole or pruned, its accessors still answer but the tree no longer uses
// it. The slices it returns are read-only views.
type Node struct {
	id     policy.NodeID
	parent *Node
	// hashes are the prefix-chained page hashes, one per page: the key
	// length (pages) always equals len(hashes).
	hashes []pagehash.Hash
	// tokens are the page tokens (len = pages*page_tokens) when the node
	// was inserted from tokens, nil when it was inserted from hashes.
	tokens []uint32
	// Children: a short slice, or a map once there are more than
	// kidListMax (then kids is nil).
	kids   []*Node
	kidMap map[pagehash.Hash]*Node

	hits       uint64
	lastAccess uint64
	depth      int
	lockRefs   int32
	residency  Residency
	// backupPending is the replicated backup-pending marker, separate
	// from request locks.
	backupPending bool
	// evictable is what the tree last reported to the evictor.
	evictable bool
	removed   bool
}

// ID returns the node's id.
func (n *Node) ID() policy.NodeID { return n.id }

// Parent returns the node's parent (nil for the root).
func (n *Node) Parent() *Node { return n.parent }

// Pages returns the node's length in pages.
func (n *Node) Pages() int { return len(n.hashes) }

// Depth returns the number of pages above the node.
func (n *Node) Depth() int { return n.depth }

// Hashes returns the node's page hashes (read-only).
func (n *Node) Hashes() []pagehash.Hash { return n.hashes }

// Tokens returns the node's tokens (read-only), or nil when the node was
// inserted from page hashes.
func (n *Node) Tokens() []uint32 { return n.tokens }

// Hits returns how many matches reached the node.
func (n *Node) Hits() uint64 { return n.hits }

// LastAccess returns the logical time of the node's creation or last hit.
func (n *Node) LastAccess() uint64 { return n.lastAccess }

// LockRefs returns the number of request locks held on the node or on
// its descendants.
func (n *Node) LockRefs() int { return int(n.lockRefs) }

// BackupPending reports the replicated backup-pending marker.
func (n *Node) BackupPending() bool { return n.backupPending }

// Residency returns the tiers that hold the node's pages.
func (n *Node) Residency() Residency { return n.residency }

// Children returns the number of children.
func (n *Node) Children() int {
	if n.kidMap != nil {
		return len(n.kidMap)
	}
	return len(n.kids)
}

// IsLeaf reports whether the node has no children.
func (n *Node) IsLeaf() bool { return n.Children() == 0 }

// Removed reports whether the node has left the tree.
func (n *Node) Removed() bool { return n.removed }

func (n *Node) child(h pagehash.Hash) *Node {
	if n.kidMap != nil {
		return n.kidMap[h]
	}
	for _, c := range n.kids {
		if c.hashes[0] == h {
			return c
		}
	}
	return nil
}

func (n *Node) addChild(c *Node) {
	if n.kidMap != nil {
		n.kidMap[c.hashes[0]] = c
		return
	}
	if len(n.kids) < kidListMax {
		n.kids = append(n.kids, c)
		return
	}
	n.kidMap = make(map[pagehash.Hash]*Node, 2*kidListMax)
	for _, k := range n.kids {
		n.kidMap[k.hashes[0]] = k
	}
	n.kidMap[c.hashes[0]] = c
	n.kids = nil
}

// replaceChild puts nw where old was; both start with the same page.
func (n *Node) replaceChild(old, nw *Node) {
	if n.kidMap != nil {
		n.kidMap[nw.hashes[0]] = nw
		return
	}
	for i, c := range n.kids {
		if c == old {
			n.kids[i] = nw
			return
		}
	}
}

func (n *Node) removeChild(c *Node) {
	if n.kidMap != nil {
		delete(n.kidMap, c.hashes[0])
		return
	}
	for i, k := range n.kids {
		if k == c {
			// NB: keep insertion order (not swap-remove) so dumps stay
			// readable; lists are at most kidListMax long.
			n.kids = slices.Delete(n.kids, i, i+1)
			return
		}
	}
}

// sortedChildren returns the children ordered by node id, the total order
// every walk that reports events uses (map order is random).
func (n *Node) sortedChildren() []*Node {
	var out []*Node
	if n.kidMap != nil {
		out = make([]*Node, 0, len(n.kidMap))
		for _, c := range n.kidMap {
			out = append(out, c)
		}
	} else {
		out = slices.Clone(n.kids)
	}
	slices.SortFunc(out, func(a, b *Node) int {
		switch {
		case a.id < b.id:
			return -1
		case a.id > b.id:
			return 1
		}
		return 0
	})
	return out
}

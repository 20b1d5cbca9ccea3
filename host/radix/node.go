package radix

import (
	"encoding/binary"
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
	kidMap map[uint64]*Node
	// kidClash holds the children whose first page shares its first 8
	// bytes with another child's (kidMap keeps one of them): never seen
	// with SHA-256 keys, but the tree stays correct if it happens.
	kidClash []*Node

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
	// borrowed: hashes is a sub-slice of a caller's read-only key
	// (InsertHashesBorrowed, ExtendBorrowed), so splits and trims may
	// re-slice it without pinning memory the tree owns.
	borrowed bool
	removed  bool
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
		return len(n.kidMap) + len(n.kidClash)
	}
	return len(n.kids)
}

// IsLeaf reports whether the node has no children.
func (n *Node) IsLeaf() bool { return n.Children() == 0 }

// Removed reports whether the node has left the tree.
func (n *Node) Removed() bool { return n.removed }

// hashEq compares two page hashes as four words: cheaper than the
// generic 32-byte memequal on the hot match path.
func hashEq(a, b *pagehash.Hash) bool {
	return binary.LittleEndian.Uint64(a[0:8]) == binary.LittleEndian.Uint64(b[0:8]) &&
		binary.LittleEndian.Uint64(a[8:16]) == binary.LittleEndian.Uint64(b[8:16]) &&
		binary.LittleEndian.Uint64(a[16:24]) == binary.LittleEndian.Uint64(b[16:24]) &&
		binary.LittleEndian.Uint64(a[24:32]) == binary.LittleEndian.Uint64(b[24:32])
}

// kidKey is the child map's key: the first 8 bytes of the first page hash.
func kidKey(h *pagehash.Hash) uint64 { return binary.LittleEndian.Uint64(h[0:8]) }

func (n *Node) child(h *pagehash.Hash) *Node {
	if n.kidMap != nil {
		if c := n.kidMap[kidKey(h)]; c != nil && hashEq(&c.hashes[0], h) {
			return c
		}
		for _, c := range n.kidClash {
			if hashEq(&c.hashes[0], h) {
				return c
			}
		}
		return nil
	}
	for _, c := range n.kids {
		if hashEq(&c.hashes[0], h) {
			return c
		}
	}
	return nil
}

func (n *Node) addChild(c *Node) {
	if n.kidMap == nil {
		if len(n.kids) < kidListMax {
			n.kids = append(n.kids, c)
			return
		}
		n.kidMap = make(map[uint64]*Node, 2*kidListMax)
		for _, k := range n.kids {
			n.mapChild(k)
		}
		n.kids = nil
	}
	n.mapChild(c)
}

func (n *Node) mapChild(c *Node) {
	k := kidKey(&c.hashes[0])
	if n.kidMap[k] != nil {
		n.kidClash = append(n.kidClash, c)
		return
	}
	n.kidMap[k] = c
}

// replaceChild puts nw where old was; nw starts with the page old
// started with (old may already have been cut).
func (n *Node) replaceChild(old, nw *Node) {
	if n.kidMap != nil {
		if k := kidKey(&nw.hashes[0]); n.kidMap[k] == old {
			n.kidMap[k] = nw
			return
		}
		for i, c := range n.kidClash {
			if c == old {
				n.kidClash[i] = nw
				return
			}
		}
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
		k := kidKey(&c.hashes[0])
		if n.kidMap[k] == c {
			delete(n.kidMap, k)
			// Promote a clashing child with the same key, if any.
			for i, o := range n.kidClash {
				if kidKey(&o.hashes[0]) == k {
					n.kidMap[k] = o
					n.kidClash = slices.Delete(n.kidClash, i, i+1)
					break
				}
			}
			return
		}
		for i, o := range n.kidClash {
			if o == c {
				n.kidClash = slices.Delete(n.kidClash, i, i+1)
				return
			}
		}
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
		out = make([]*Node, 0, n.Children())
		for _, c := range n.kidMap {
			out = append(out, c)
		}
		out = append(out, n.kidClash...)
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

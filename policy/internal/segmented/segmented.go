// Package segmented holds LRU, the segmented-LRU core that slru, proven and
// hindsight share: a table of live nodes, the victim heap of evictable
// leaves ordered by (class, last access, node id), and a protected segment
// capped at a share of the cached pages whose least recently used nodes are
// demoted while it holds more.
//
// The policy keeps its own state of a node (T) and defines the classes: a
// class function returns an unprotected node's class from that state,
// lower evicted first, and protected nodes take the policy's protected
// class. The core owns everything
// else: pages, last access, protection and the order. It is a plain
// deterministic value: no goroutines, no clock, no map iteration. The
// package must never decide what earns protection or what a class is; those
// are the policy's.
package segmented

import (
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/internal/leafheap"
)

// node is the core's state of one live node: the policy's part first, so a
// T of 8-byte words packs with the two words that follow.
type node[T any] struct {
	own        T
	lastAccess uint64
	pages      int64
}

// LRU is the segmented-LRU core over the policy's per-node state T. A node
// is protected exactly while it is in the protected segment's heap. Use
// New.
type LRU[T any] struct {
	nodes   *leafheap.Table[node[T]]
	victims leafheap.Heap // evictable leaves by (class, last access)
	prot    leafheap.Protection
	// class is an unprotected node's class; protected nodes are in
	// protectedClass.
	class          func(v *T) uint64
	protectedClass uint64
}

// New returns an empty LRU whose protected nodes may hold at most share of
// the cached pages and rank in protectedClass of the victim order; class
// returns an unprotected node's class (lower goes first). class should be
// a plain function, not a closure, and read only its argument.
func New[T any](share float64, protectedClass uint64, class func(v *T) uint64) *LRU[T] {
	return &LRU[T]{nodes: leafheap.NewTable[node[T]](), prot: leafheap.Protection{Share: share}, class: class, protectedClass: protectedClass}
}

// Add returns id's slot, allocating a zeroed node (no pages, unprotected)
// when id is new; fresh reports whether it was new.
func (c *LRU[T]) Add(id policy.NodeID) (slot int32, fresh bool) { return c.nodes.Add(id) }

// Lookup returns id's slot.
func (c *LRU[T]) Lookup(id policy.NodeID) (int32, bool) { return c.nodes.Lookup(id) }

// At returns the policy's state of the node at slot.
func (c *LRU[T]) At(slot int32) *T { return &c.nodes.At(slot).own }

// Pages returns the pages of the node at slot as last applied.
func (c *LRU[T]) Pages(slot int32) int64 { return c.nodes.At(slot).pages }

// LastAccess returns the last access of the node at slot as last applied.
func (c *LRU[T]) LastAccess(slot int32) uint64 { return c.nodes.At(slot).lastAccess }

// Protected reports whether the node at slot is protected.
func (c *LRU[T]) Protected(slot int32) bool { return c.prot.Holds(slot) }

// CachedPages returns the pages of every live node.
func (c *LRU[T]) CachedPages() int64 { return c.prot.Pages() }

// Apply sets the node at slot (id) to pages pages and last access at,
// protects it when protect is set (a protected node stays protected),
// re-keys it if it is an evictable leaf and demotes the least recently
// used protected nodes while the segment holds more than its share. The
// policy updates its own state of the node first: the new key is computed
// from it.
func (c *LRU[T]) Apply(slot int32, id policy.NodeID, pages int, at uint64, protect bool) {
	v := c.nodes.At(slot)
	protected := c.prot.Holds(slot)
	c.prot.Resize(int64(pages)-v.pages, protected)
	v.pages = int64(pages)
	v.lastAccess = at
	if protect && !protected {
		protected = true
		c.prot.Protect(v.pages)
	}
	if protected {
		c.prot.Touch(slot, id, at)
	}
	c.Rekey(slot, id)
	c.demote()
}

// Unprotect takes the node at slot out of the protected segment, if it is
// in it, without re-keying it; the Apply that follows does.
func (c *LRU[T]) Unprotect(slot int32) {
	if c.prot.Holds(slot) {
		c.prot.Demote(slot, c.nodes.At(slot).pages)
	}
}

// Rekey recomputes the victim key of the node at slot (id) from the
// policy's state, if it is an evictable leaf.
func (c *LRU[T]) Rekey(slot int32, id policy.NodeID) {
	if c.victims.Contains(slot) {
		c.victims.Set(slot, id, c.key(slot))
	}
}

// key is the victim key of the node at slot: (class, last access).
func (c *LRU[T]) key(slot int32) leafheap.Key {
	v := c.nodes.At(slot)
	k := leafheap.Key{A: c.protectedClass, B: v.lastAccess}
	if !c.prot.Holds(slot) {
		k.A = c.class(&v.own)
	}
	return k
}

// Class returns id's current class and whether id is known.
func (c *LRU[T]) Class(id policy.NodeID) (int, bool) {
	slot, ok := c.nodes.Lookup(id)
	if !ok {
		return 0, false
	}
	return int(c.key(slot).A), true
}

// demote moves the oldest protected nodes to probation while protected
// nodes hold more than their share of the cached pages; an evictable leaf
// is re-keyed with its unprotected class.
func (c *LRU[T]) demote() {
	for {
		slot, id, ok := c.prot.Overfull()
		if !ok {
			return
		}
		c.prot.Demote(slot, c.nodes.At(slot).pages)
		c.Rekey(slot, id)
	}
}

// Remove forgets id; false when it was not known.
func (c *LRU[T]) Remove(id policy.NodeID) bool {
	slot, ok := c.nodes.Lookup(id)
	if !ok {
		return false
	}
	c.prot.Forget(slot, c.nodes.At(slot).pages, c.prot.Holds(slot))
	c.victims.Remove(slot)
	c.nodes.Delete(id)
	c.demote()
	return true
}

// SetEvictable adds id to or removes it from the candidates. Unknown ids
// are ignored.
func (c *LRU[T]) SetEvictable(id policy.NodeID, evictable bool) {
	slot, ok := c.nodes.Lookup(id)
	if !ok {
		return
	}
	if evictable {
		c.victims.Set(slot, id, c.key(slot))
	} else {
		c.victims.Remove(slot)
	}
}

// Victim returns the least evictable leaf in (class, last access, id).
func (c *LRU[T]) Victim() (policy.NodeID, bool) {
	_, id, _, ok := c.victims.Min()
	return id, ok
}

// Check verifies the internal invariants; "" when they hold.
func (c *LRU[T]) Check() string {
	if msg := c.victims.Check(); msg != "" {
		return "victim heap: " + msg
	}
	return c.prot.Check()
}

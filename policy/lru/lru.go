// Package lru is the least-recently-used eviction policy: the victim is the
// evictable leaf with the oldest replicated last access, ties broken by node
// id.
//
// It keeps every live node's last access and an indexed min-heap of the
// evictable ones, so a leaf that becomes evictable long after its last use
// (a parent whose last child was evicted) is ordered by that old use, not
// appended as if new. It must never read a wall clock or anything
// rank-local: its order is a function of the replicated events alone.
//
// Memory: per live node one map entry (id to slot), 16 bytes of state and,
// while evictable, a 32-byte heap entry and a 4-byte position; no history.
package lru

import (
	"fmt"

	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/internal/leafheap"
)

// Name is the registered name of the policy.
const Name = "lru"

// Register adds lru to r.
func Register(r *policy.Registry) error {
	return r.Register(policy.Registration{
		Type:    policy.EvictorV1,
		Name:    Name,
		Doc:     "least recently used evictable leaf first (last access, node id)",
		Factory: func(opts policy.Options) (policy.Evictor, error) { return New(opts) },
	})
}

type node struct {
	lastAccess uint64
}

// LRU is the lru Evictor. The zero value is not usable; call New.
type LRU struct {
	nodes *leafheap.Table[node]
	heap  leafheap.Heap
}

// New returns an empty LRU. It takes no parameters.
func New(opts policy.Options) (*LRU, error) {
	if err := policy.CheckParams(Name, opts.Params); err != nil {
		return nil, fmt.Errorf("new lru: %w", err)
	}
	return &LRU{nodes: leafheap.NewTable[node]()}, nil
}

// Name returns "lru".
func (l *LRU) Name() string { return Name }

// Insert records a new node at its last access.
func (l *LRU) Insert(n policy.NodeInfo) { l.touch(n.ID, n.LastAccess) }

// Hit moves n to its new last access.
func (l *LRU) Hit(n policy.NodeInfo) { l.touch(n.ID, max(n.LastAccess, n.Time)) }

// Update takes n's last access from the tree (a split keeps it, a trim does
// not change it).
func (l *LRU) Update(n policy.NodeInfo) { l.touch(n.ID, n.LastAccess) }

func (l *LRU) touch(id policy.NodeID, at uint64) {
	s, _ := l.nodes.Add(id)
	v := l.nodes.At(s)
	v.lastAccess = at
	if l.heap.Contains(s) {
		l.heap.Set(s, id, leafheap.Key{A: at})
	}
}

// Remove forgets id.
func (l *LRU) Remove(id policy.NodeID) {
	if s, ok := l.nodes.Delete(id); ok {
		l.heap.Remove(s)
	}
}

// SetEvictable adds id to or removes it from the candidates, ordered by its
// recorded last access. Unknown ids are ignored.
func (l *LRU) SetEvictable(id policy.NodeID, evictable bool) {
	s, ok := l.nodes.Lookup(id)
	if !ok {
		return
	}
	if evictable {
		l.heap.Set(s, id, leafheap.Key{A: l.nodes.At(s).lastAccess})
	} else {
		l.heap.Remove(s)
	}
}

// Victim returns the evictable leaf with the oldest last access.
func (l *LRU) Victim() (policy.NodeID, bool) {
	_, id, _, ok := l.heap.Min()
	return id, ok
}

// Len returns the number of live nodes the policy tracks.
func (l *LRU) Len() int { return l.nodes.Len() }

// Check verifies the policy's internal invariants; it returns "" when they
// hold. The conformance suite calls it after every event.
func (l *LRU) Check() string { return l.heap.Check() }

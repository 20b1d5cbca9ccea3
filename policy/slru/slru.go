// Package slru is the segmented LRU eviction policy: a node matched at least
// twice (hit count >= 2) is protected, and the victim is the evictable leaf
// least in the order (protected, last access, node id), so unprotected
// leaves go first, oldest first.
//
// Protected nodes may hold at most a share of the cached pages
// (Params["protected_share"], default 0.8); past it the protected nodes with
// the oldest last access are demoted until the share holds again. A demoted
// node is promoted back by its next hit. Every decision reads only the
// replicated events; the package must never read a clock or rank-local
// state.
//
// Memory: per live node one map entry, 32 bytes of state, a 32-byte entry
// plus a 4-byte position in the victim heap while evictable and another in
// the protected heap while protected; no history.
package slru

import (
	"fmt"

	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/internal/leafheap"
)

// Name is the registered name of the policy.
const Name = "slru"

// DefaultProtectedShare is the default largest share of cached pages that
// protected nodes may hold.
const DefaultProtectedShare = 0.8

// Register adds slru to r.
func Register(r *policy.Registry) error {
	return r.Register(policy.Registration{
		Type:    policy.EvictorV1,
		Name:    Name,
		Doc:     "segmented LRU: nodes hit twice are protected (protected, last access, node id)",
		Factory: func(opts policy.Options) (policy.Evictor, error) { return New(opts) },
	})
}

type node struct {
	lastAccess uint64
	pages      int64
	protected  bool
}

// SLRU is the slru Evictor. Use New.
type SLRU struct {
	nodes   *leafheap.Table[node]
	victims leafheap.Heap // evictable leaves by (protected, last access)
	prot    leafheap.Protection
}

// New returns an empty SLRU. It accepts Params["protected_share"] in
// [0, 1].
func New(opts policy.Options) (*SLRU, error) {
	if err := policy.CheckParams(Name, opts.Params, "protected_share"); err != nil {
		return nil, fmt.Errorf("new slru: %w", err)
	}
	share, err := policy.RangeParam(opts.Params, "protected_share", DefaultProtectedShare, 1)
	if err != nil {
		return nil, fmt.Errorf("new slru: %w", err)
	}
	return &SLRU{nodes: leafheap.NewTable[node](), prot: leafheap.Protection{Share: share}}, nil
}

// Name returns "slru".
func (s *SLRU) Name() string { return Name }

// Insert records a new node; a node split off a protected one (it carries
// the hit count) starts protected.
func (s *SLRU) Insert(n policy.NodeInfo) { s.apply(n, n.LastAccess, n.Hits >= 2) }

// Hit refreshes n and protects it from its second hit on.
func (s *SLRU) Hit(n policy.NodeInfo) { s.apply(n, max(n.LastAccess, n.Time), n.Hits >= 2) }

// Update takes n's new page count and last access.
func (s *SLRU) Update(n policy.NodeInfo) {
	slot, fresh := s.nodes.Add(n.ID)
	s.set(slot, n, n.LastAccess, !fresh && s.nodes.At(slot).protected || fresh && n.Hits >= 2)
}

func (s *SLRU) apply(n policy.NodeInfo, at uint64, protect bool) {
	slot, _ := s.nodes.Add(n.ID)
	s.set(slot, n, at, protect || s.nodes.At(slot).protected)
}

func (s *SLRU) set(slot int32, n policy.NodeInfo, at uint64, protect bool) {
	v := s.nodes.At(slot)
	s.prot.Resize(int64(n.Pages)-v.pages, v.protected)
	v.pages = int64(n.Pages)
	v.lastAccess = at
	if protect && !v.protected {
		v.protected = true
		s.prot.Protect(v.pages)
	}
	if v.protected {
		s.prot.Touch(slot, n.ID, at)
	}
	if s.victims.Contains(slot) {
		s.victims.Set(slot, n.ID, key(v))
	}
	s.demote()
}

func key(v *node) leafheap.Key {
	k := leafheap.Key{B: v.lastAccess}
	if v.protected {
		k.A = 1
	}
	return k
}

// demote moves the oldest protected nodes to probation while protected
// nodes hold more than their share of the cached pages.
func (s *SLRU) demote() {
	leafheap.DemoteOverfull(&s.prot, s.nodes, &s.victims, demoted)
}

// demoted takes v out of the protected segment: its pages and new key.
func demoted(v *node) (int64, leafheap.Key) {
	v.protected = false
	return v.pages, key(v)
}

// Remove forgets id.
func (s *SLRU) Remove(id policy.NodeID) {
	slot, ok := s.nodes.Lookup(id)
	if !ok {
		return
	}
	v := s.nodes.At(slot)
	s.prot.Forget(slot, v.pages, v.protected)
	s.victims.Remove(slot)
	s.nodes.Delete(id)
	s.demote()
}

// SetEvictable adds id to or removes it from the candidates. Unknown ids
// are ignored.
func (s *SLRU) SetEvictable(id policy.NodeID, evictable bool) {
	slot, ok := s.nodes.Lookup(id)
	if !ok {
		return
	}
	if evictable {
		s.victims.Set(slot, id, key(s.nodes.At(slot)))
	} else {
		s.victims.Remove(slot)
	}
}

// Victim returns the least evictable leaf in (protected, last access, id).
func (s *SLRU) Victim() (policy.NodeID, bool) {
	_, id, _, ok := s.victims.Min()
	return id, ok
}

// Protected reports whether id is currently protected.
func (s *SLRU) Protected(id policy.NodeID) bool {
	slot, ok := s.nodes.Lookup(id)
	return ok && s.nodes.At(slot).protected
}

// Check verifies the internal invariants; "" when they hold.
func (s *SLRU) Check() string {
	if msg := s.victims.Check(); msg != "" {
		return "victim heap: " + msg
	}
	return s.prot.Check()
}

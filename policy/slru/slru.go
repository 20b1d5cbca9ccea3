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
// The order, the protected segment and its demotions are the segmented-LRU
// core shared with proven and hindsight (policy/internal/segmented); this
// package decides only what earns protection.
//
// Memory: per live node one map entry, 16 bytes of state, a 32-byte entry
// plus a 4-byte position in the victim heap while evictable and another in
// the protected heap while protected; no history.
package slru

import (
	"fmt"

	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/internal/segmented"
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

// node is slru's own state of a node: none, protection is the core's.
type node struct{}

// Classes of the victim order: unprotected nodes go first.
const (
	classProbation = 0
	classProtected = 1
)

// class is the victim class of an unprotected node.
func class(*node) uint64 { return classProbation }

// SLRU is the slru Evictor. Use New.
type SLRU struct {
	core *segmented.LRU[node]
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
	return &SLRU{core: segmented.New(share, classProtected, class)}, nil
}

// Name returns "slru".
func (s *SLRU) Name() string { return Name }

// Insert records a new node; a node split off a protected one (it carries
// the hit count) starts protected.
func (s *SLRU) Insert(n policy.NodeInfo) { s.apply(n, n.LastAccess, n.Hits >= 2) }

// Hit refreshes n and protects it from its second hit on.
func (s *SLRU) Hit(n policy.NodeInfo) { s.apply(n, max(n.LastAccess, n.Time), n.Hits >= 2) }

// Update takes n's new page count and last access; a node it creates starts
// protected from its second hit on.
func (s *SLRU) Update(n policy.NodeInfo) {
	slot, fresh := s.core.Add(n.ID)
	s.core.Apply(slot, n.ID, n.Pages, n.LastAccess, fresh && n.Hits >= 2)
}

func (s *SLRU) apply(n policy.NodeInfo, at uint64, protect bool) {
	slot, _ := s.core.Add(n.ID)
	s.core.Apply(slot, n.ID, n.Pages, at, protect)
}

// Remove forgets id.
func (s *SLRU) Remove(id policy.NodeID) { s.core.Remove(id) }

// SetEvictable adds id to or removes it from the candidates. Unknown ids
// are ignored.
func (s *SLRU) SetEvictable(id policy.NodeID, evictable bool) { s.core.SetEvictable(id, evictable) }

// Victim returns the least evictable leaf in (protected, last access, id).
func (s *SLRU) Victim() (policy.NodeID, bool) { return s.core.Victim() }

// Protected reports whether id is currently protected.
func (s *SLRU) Protected(id policy.NodeID) bool {
	slot, ok := s.core.Lookup(id)
	return ok && s.core.Protected(slot)
}

// Check verifies the internal invariants; "" when they hold.
func (s *SLRU) Check() string { return s.core.Check() }

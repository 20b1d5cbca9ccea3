// Package sieve is the SIEVE eviction policy (Zhang et al., NSDI'24)
// adapted to a radix tree whose victims must be evictable leaves.
//
// Nodes sit in one FIFO in insertion order, each with a visited bit set by a
// hit. A hand sweeps from the oldest node toward the newest: a visited
// evictable leaf under the hand has its bit cleared and is passed over; the
// first unvisited one is the victim. After the newest node the hand wraps to
// the oldest. Nodes that are not evictable leaves are skipped by the sweep
// (they cannot be evicted) but keep their bit.
//
// The sweep is kept as two min-heaps keyed by insertion sequence: the
// evictable leaves ahead of the hand and those behind it, so a step is
// O(log n) and a leaf that becomes evictable lands on the correct side of
// the hand. Only replicated events drive it; the package must never read a
// clock or rank-local state.
//
// Memory: per live node one map entry, 16 bytes of state and, while
// evictable, a 32-byte heap entry and two 4-byte positions; no history.
package sieve

import (
	"fmt"

	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/internal/leafheap"
)

// Name is the registered name of the policy.
const Name = "sieve"

// Register adds sieve to r.
func Register(r *policy.Registry) error {
	return r.Register(policy.Registration{
		Type:    policy.EvictorV1,
		Name:    Name,
		Doc:     "SIEVE: FIFO with visited bits and a sweeping hand, over evictable leaves",
		Factory: func(opts policy.Options) (policy.Evictor, error) { return New(opts) },
	})
}

type node struct {
	seq     uint64
	visited bool
}

// Sieve is the sieve Evictor. Use New.
type Sieve struct {
	nodes  *leafheap.Table[node]
	ahead  *leafheap.Heap // evictable leaves with seq > hand
	behind *leafheap.Heap // evictable leaves with seq <= hand
	hand   uint64
	seq    uint64
}

// New returns an empty Sieve. It takes no parameters.
func New(opts policy.Options) (*Sieve, error) {
	if err := policy.CheckParams(Name, opts.Params); err != nil {
		return nil, fmt.Errorf("new sieve: %w", err)
	}
	return &Sieve{nodes: leafheap.NewTable[node](), ahead: new(leafheap.Heap), behind: new(leafheap.Heap)}, nil
}

// Name returns "sieve".
func (s *Sieve) Name() string { return Name }

// Insert appends a new node at the head of the FIFO.
func (s *Sieve) Insert(n policy.NodeInfo) {
	if slot, fresh := s.nodes.Add(n.ID); fresh {
		s.seq++
		s.nodes.At(slot).seq = s.seq
	}
}

// Hit sets n's visited bit.
func (s *Sieve) Hit(n policy.NodeInfo) {
	slot, fresh := s.nodes.Add(n.ID)
	v := s.nodes.At(slot)
	if fresh {
		s.seq++
		v.seq = s.seq
	}
	v.visited = true
}

// Update changes nothing SIEVE orders by; unknown nodes are added.
func (s *Sieve) Update(n policy.NodeInfo) { s.Insert(n) }

// Remove forgets id.
func (s *Sieve) Remove(id policy.NodeID) {
	if slot, ok := s.nodes.Delete(id); ok {
		s.ahead.Remove(slot)
		s.behind.Remove(slot)
	}
}

// SetEvictable adds id to or removes it from the sweep, on its side of the
// hand.
func (s *Sieve) SetEvictable(id policy.NodeID, evictable bool) {
	slot, ok := s.nodes.Lookup(id)
	if !ok {
		return
	}
	if !evictable {
		s.ahead.Remove(slot)
		s.behind.Remove(slot)
		return
	}
	v := s.nodes.At(slot)
	if v.seq > s.hand {
		s.ahead.Set(slot, id, leafheap.Key{A: v.seq})
	} else {
		s.behind.Set(slot, id, leafheap.Key{A: v.seq})
	}
}

// Victim sweeps the hand to the first unvisited evictable leaf, clearing
// the bits it passes; calling it again without events returns the same.
func (s *Sieve) Victim() (policy.NodeID, bool) {
	for {
		if s.ahead.Len() == 0 {
			if s.behind.Len() == 0 {
				return 0, false
			}
			// Wrap: everything is ahead of a hand before the oldest node.
			s.ahead, s.behind = s.behind, s.ahead
			s.hand = 0
		}
		slot, id, _, _ := s.ahead.Min()
		v := s.nodes.At(slot)
		if !v.visited {
			return id, true
		}
		v.visited = false
		s.hand = v.seq
		s.ahead.Remove(slot)
		s.behind.Set(slot, id, leafheap.Key{A: v.seq})
	}
}

// Check verifies the internal invariants; "" when they hold.
func (s *Sieve) Check() string {
	if msg := s.ahead.Check(); msg != "" {
		return "ahead: " + msg
	}
	if msg := s.behind.Check(); msg != "" {
		return "behind: " + msg
	}
	if _, _, k, ok := s.ahead.Min(); ok && k.A <= s.hand {
		return fmt.Sprintf("node with seq %d ahead of hand %d", k.A, s.hand)
	}
	return ""
}

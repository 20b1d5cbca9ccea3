// Package s3fifo is the S3-FIFO eviction policy (Yang et al., SOSP'23)
// adapted to a radix tree whose victims must be evictable leaves.
//
// New nodes enter a small FIFO queue; a node evicted from it leaves its tail
// page hash in a ghost queue, and a node inserted with a tail in the ghost
// queue enters the main FIFO directly. Each node counts hits up to 3. When
// the small queue holds more than Params["small_share"] (default 0.1) of the
// cached pages, or the main queue has no evictable leaf, the victim comes
// from the small queue: its oldest evictable leaf moves to main if it was
// hit, else it is the victim. Otherwise the oldest evictable leaf of main is
// reinserted at main's tail with one hit less while it has hits, else it is
// the victim. Only evictable leaves take part in the scans; queue sizes
// count every cached node. The scans happen in Victim, driven only by
// replicated events, so every replica makes the same moves.
//
// Memory: per live node one map entry, 40 bytes of state and, while
// evictable, a 32-byte heap entry and a 4-byte position; the ghost queue
// holds at most as many 8-byte tail-hash prefixes as the peak number of live
// nodes (plus one map entry each).
package s3fifo

import (
	"encoding/binary"
	"fmt"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/internal/leafheap"
)

// Name is the registered name of the policy.
const Name = "s3fifo"

// DefaultSmallShare is the default share of cached pages the small queue
// may hold before it is preferred for eviction.
const DefaultSmallShare = 0.1

const maxFreq = 3

// Register adds s3fifo to r.
func Register(r *policy.Registry) error {
	return r.Register(policy.Registration{
		Type:    policy.EvictorV1,
		Name:    Name,
		Doc:     "S3-FIFO: small probationary FIFO, main FIFO with reinsertion, ghost tail hashes",
		Factory: func(opts policy.Options) (policy.Evictor, error) { return New(opts) },
	})
}

type node struct {
	seq   uint64
	pages int64
	tail  uint64
	freq  uint8
	main  bool
}

// S3FIFO is the s3fifo Evictor. Use New.
type S3FIFO struct {
	smallShare float64
	nodes      *leafheap.Table[node]
	small      leafheap.Heap // evictable leaves of the small queue by seq
	mainQ      leafheap.Heap // evictable leaves of the main queue by seq
	seq        uint64
	pages      int64
	smallPages int64
	ghost      Ghost
}

// New returns an empty S3FIFO. It accepts Params["small_share"] in (0, 1).
func New(opts policy.Options) (*S3FIFO, error) {
	if err := policy.CheckParams(Name, opts.Params, "small_share"); err != nil {
		return nil, fmt.Errorf("new s3fifo: %w", err)
	}
	share := DefaultSmallShare
	if v, ok := opts.Params["small_share"]; ok {
		if !(v > 0 && v < 1) {
			return nil, fmt.Errorf("new s3fifo: small_share %v is outside (0, 1)", v)
		}
		share = v
	}
	return &S3FIFO{smallShare: share, nodes: leafheap.NewTable[node]()}, nil
}

// Name returns "s3fifo".
func (s *S3FIFO) Name() string { return Name }

// TailKey is the 8-byte prefix of a page hash that ghost histories keep.
func TailKey(h pagehash.Hash) uint64 { return binary.LittleEndian.Uint64(h[:8]) }

// Insert puts a new node in the small queue, or in main when its tail hash
// is in the ghost queue.
func (s *S3FIFO) Insert(n policy.NodeInfo) {
	slot, fresh := s.nodes.Add(n.ID)
	if !fresh {
		s.Update(n)
		return
	}
	v := s.nodes.At(slot)
	s.seq++
	v.seq = s.seq
	v.tail = TailKey(n.Tail)
	v.pages = int64(n.Pages)
	s.pages += v.pages
	if s.ghost.Contains(v.tail) {
		v.main = true
	} else {
		s.smallPages += v.pages
	}
	s.ghost.Fit(s.nodes.Len())
}

// Hit counts a hit, saturating at 3.
func (s *S3FIFO) Hit(n policy.NodeInfo) {
	slot, ok := s.nodes.Lookup(n.ID)
	if !ok {
		s.Insert(n)
		return
	}
	if v := s.nodes.At(slot); v.freq < maxFreq {
		v.freq++
	}
}

// Update takes n's new page count and tail hash; its queue position stays.
func (s *S3FIFO) Update(n policy.NodeInfo) {
	slot, ok := s.nodes.Lookup(n.ID)
	if !ok {
		s.Insert(n)
		return
	}
	v := s.nodes.At(slot)
	d := int64(n.Pages) - v.pages
	s.pages += d
	if !v.main {
		s.smallPages += d
	}
	v.pages = int64(n.Pages)
	v.tail = TailKey(n.Tail)
}

// Remove forgets id; a node leaving from the small queue leaves its tail
// hash in the ghost queue.
func (s *S3FIFO) Remove(id policy.NodeID) {
	slot, ok := s.nodes.Lookup(id)
	if !ok {
		return
	}
	v := s.nodes.At(slot)
	s.pages -= v.pages
	if !v.main {
		s.smallPages -= v.pages
		s.ghost.Add(v.tail)
	}
	s.small.Remove(slot)
	s.mainQ.Remove(slot)
	s.nodes.Delete(id)
}

// SetEvictable adds id to or removes it from its queue's candidates.
func (s *S3FIFO) SetEvictable(id policy.NodeID, evictable bool) {
	slot, ok := s.nodes.Lookup(id)
	if !ok {
		return
	}
	v := s.nodes.At(slot)
	switch {
	case !evictable:
		s.small.Remove(slot)
		s.mainQ.Remove(slot)
	case v.main:
		s.mainQ.Set(slot, id, leafheap.Key{A: v.seq})
	default:
		s.small.Set(slot, id, leafheap.Key{A: v.seq})
	}
}

// Victim runs the S3-FIFO scan over the evictable leaves and returns the
// node it would evict; calling it again without events returns the same.
func (s *S3FIFO) Victim() (policy.NodeID, bool) {
	for {
		if s.small.Len() > 0 && (float64(s.smallPages) > s.smallShare*float64(s.pages) || s.mainQ.Len() == 0) {
			slot, id, _, _ := s.small.Min()
			v := s.nodes.At(slot)
			if v.freq == 0 {
				return id, true
			}
			// Hit while probationary: promote to main's tail.
			s.small.Remove(slot)
			v.main, v.freq = true, 0
			s.smallPages -= v.pages
			s.seq++
			v.seq = s.seq
			s.mainQ.Set(slot, id, leafheap.Key{A: v.seq})
			continue
		}
		slot, id, _, ok := s.mainQ.Min()
		if !ok {
			return 0, false
		}
		v := s.nodes.At(slot)
		if v.freq == 0 {
			return id, true
		}
		v.freq--
		s.seq++
		v.seq = s.seq
		s.mainQ.Set(slot, id, leafheap.Key{A: v.seq})
	}
}

// Check verifies the internal invariants; "" when they hold. It walks the
// ghost queue, so it costs O(ghost size).
func (s *S3FIFO) Check() string {
	if msg := s.small.Check(); msg != "" {
		return "small queue: " + msg
	}
	if msg := s.mainQ.Check(); msg != "" {
		return "main queue: " + msg
	}
	if s.smallPages < 0 || s.smallPages > s.pages {
		return fmt.Sprintf("small pages %d outside [0, %d]", s.smallPages, s.pages)
	}
	if msg := s.ghost.Check(); msg != "" {
		return "ghost: " + msg
	}
	return ""
}

// Ghost is a bounded FIFO set of 8-byte tail-hash prefixes: the memory of
// recently evicted nodes. It holds at most its capacity entries; adding to
// a full ghost forgets the oldest. The zero value has capacity 0 until Fit.
type Ghost struct {
	ring  []uint64
	head  int
	n     int
	count map[uint64]uint32
}

// Fit raises the capacity to at least n (it never shrinks, so it is bounded
// by the peak live node count of its policy).
func (g *Ghost) Fit(n int) {
	if n <= len(g.ring) {
		return
	}
	n = max(n, 2*len(g.ring), 64)
	ring := make([]uint64, n)
	for i := 0; i < g.n; i++ {
		ring[i] = g.ring[(g.head+i)%len(g.ring)]
	}
	g.ring, g.head = ring, 0
	if g.count == nil {
		g.count = make(map[uint64]uint32, n)
	}
}

// Add remembers k, forgetting the oldest entry when full.
func (g *Ghost) Add(k uint64) {
	if len(g.ring) == 0 {
		return
	}
	if g.n == len(g.ring) {
		old := g.ring[g.head]
		g.head = (g.head + 1) % len(g.ring)
		g.n--
		g.forget(old)
	}
	g.ring[(g.head+g.n)%len(g.ring)] = k
	g.n++
	g.count[k]++
}

func (g *Ghost) forget(k uint64) {
	if c := g.count[k]; c <= 1 {
		delete(g.count, k)
	} else {
		g.count[k] = c - 1
	}
}

// Contains reports whether k is remembered.
func (g *Ghost) Contains(k uint64) bool { return g.count[k] > 0 }

// Len returns the number of ring entries.
func (g *Ghost) Len() int { return g.n }

// Check verifies that the membership map agrees with the ring.
func (g *Ghost) Check() string {
	if g.n > len(g.ring) {
		return fmt.Sprintf("%d entries in a ring of %d", g.n, len(g.ring))
	}
	total := 0
	for _, c := range g.count {
		total += int(c)
	}
	if total != g.n {
		return fmt.Sprintf("membership counts %d entries, ring holds %d", total, g.n)
	}
	return ""
}

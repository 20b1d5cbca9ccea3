// Package belady is the offline Belady (MIN) oracle under the leaf-only
// constraint: the victim is the evictable leaf whose tail page is next used
// furthest in the future (never again first), ties broken by node id. It is
// the upper bound replay prints beside the online policies.
//
// It reads the future through policy.Options.Future, which only replay can
// supply, so it refuses to build without one (ErrOffline); `kvtier serve`
// rejects it by name through that error. A node's next use is looked up at
// each event that reaches it: a request that uses a cached node's tail page
// matches through the whole node, so the node sees a Hit at that time and
// its key never goes stale between events.
//
// Memory: per live node one map entry, 16 bytes of state and, while
// evictable, a 32-byte heap entry and a 4-byte position; the Future is the
// caller's.
package belady

import (
	"errors"
	"fmt"
	"math"

	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/internal/leafheap"
)

// Name is the registered name of the policy.
const Name = "belady"

// ErrOffline is returned by New without a Future: belady is an offline
// oracle for replay only.
var ErrOffline = errors.New("belady is an offline oracle for replay only: it needs the trace's future (Options.Future), which only replay supplies")

// Register adds belady to r.
func Register(r *policy.Registry) error {
	return r.Register(policy.Registration{
		Type:    policy.EvictorV1,
		Name:    Name,
		Doc:     "offline Belady oracle (replay only): evict the leaf whose tail is next used furthest in the future",
		Factory: func(opts policy.Options) (policy.Evictor, error) { return New(opts) },
	})
}

type node struct {
	key leafheap.Key
}

// Belady is the belady Evictor. Use New.
type Belady struct {
	future policy.Future
	nodes  *leafheap.Table[node]
	heap   leafheap.Heap
}

// New returns an empty Belady reading opts.Future; without one it fails
// with ErrOffline. It takes no parameters.
func New(opts policy.Options) (*Belady, error) {
	if err := policy.CheckParams(Name, opts.Params); err != nil {
		return nil, fmt.Errorf("new belady: %w", err)
	}
	if opts.Future == nil {
		return nil, fmt.Errorf("policy %s: %w", Name, ErrOffline)
	}
	return &Belady{future: opts.Future, nodes: leafheap.NewTable[node]()}, nil
}

// Name returns "belady".
func (b *Belady) Name() string { return Name }

// Insert looks up n's next use.
func (b *Belady) Insert(n policy.NodeInfo) { b.look(n) }

// Hit looks up n's next use after this hit.
func (b *Belady) Hit(n policy.NodeInfo) { b.look(n) }

// Update looks up the next use of n's (possibly new) tail.
func (b *Belady) Update(n policy.NodeInfo) { b.look(n) }

func (b *Belady) look(n policy.NodeInfo) {
	slot, _ := b.nodes.Add(n.ID)
	// Furthest next use orders first; never used again orders before all.
	var k leafheap.Key
	if at, ok := b.future.NextUse(n.Tail, n.Time); ok {
		k.A = math.MaxUint64 - at
	}
	b.nodes.At(slot).key = k
	if b.heap.Contains(slot) {
		b.heap.Set(slot, n.ID, k)
	}
}

// Remove forgets id.
func (b *Belady) Remove(id policy.NodeID) {
	if slot, ok := b.nodes.Delete(id); ok {
		b.heap.Remove(slot)
	}
}

// SetEvictable adds id to or removes it from the candidates.
func (b *Belady) SetEvictable(id policy.NodeID, evictable bool) {
	slot, ok := b.nodes.Lookup(id)
	if !ok {
		return
	}
	if evictable {
		b.heap.Set(slot, id, b.nodes.At(slot).key)
	} else {
		b.heap.Remove(slot)
	}
}

// Victim returns the evictable leaf whose tail is next used furthest away.
func (b *Belady) Victim() (policy.NodeID, bool) {
	_, id, _, ok := b.heap.Min()
	return id, ok
}

// Check verifies the internal invariants; "" when they hold.
func (b *Belady) Check() string { return b.heap.Check() }

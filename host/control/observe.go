package control

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvtier/kvtier/host/placement"
	"github.com/kvtier/kvtier/host/radix"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/planner"
)

// observer wraps the tree's evictor to learn the tree's structural changes
// (new nodes, splits, removals), which host/radix does not report to its
// caller: the Machine must split and release the placement objects and
// markers of the nodes involved. A split shows as an Insert of a node
// that already has a child (the new prefix), followed at once by the
// Update of the cut node.
type observer struct {
	policy.Evictor
	inserted []policy.NodeID
	splits   []splitEvent
	removed  []policy.NodeID
	// prefix is a split prefix waiting for its suffix's Update.
	prefix      policy.NodeID
	prefixPages int
}

type splitEvent struct {
	prefix, suffix policy.NodeID
	at             int
}

// Insert forwards and records a new node or a split prefix.
func (o *observer) Insert(n policy.NodeInfo) {
	o.Evictor.Insert(n)
	if n.Children > 0 {
		o.prefix, o.prefixPages = n.ID, n.Pages
		return
	}
	o.inserted = append(o.inserted, n.ID)
}

// Update forwards and completes a split.
func (o *observer) Update(n policy.NodeInfo) {
	o.Evictor.Update(n)
	if o.prefix != 0 {
		o.splits = append(o.splits, splitEvent{prefix: o.prefix, suffix: n.ID, at: o.prefixPages})
		o.prefix = 0
	}
}

// Remove forwards and records a removal.
func (o *observer) Remove(id policy.NodeID) {
	o.Evictor.Remove(id)
	o.removed = append(o.removed, id)
}

// Finished forwards to the evictor when it observes requests.
func (o *observer) Finished(r policy.RequestInfo) {
	if ro, ok := o.Evictor.(policy.RequestObserver); ok {
		ro.Finished(r)
	}
}

// TailRanked forwards the evictor's answer.
func (o *observer) TailRanked() bool {
	tr, ok := o.Evictor.(radix.TailRanker)
	return ok && tr.TailRanked()
}

// settle applies the tree's recorded structural changes to the markers,
// the placements and the spill queue. It runs after every tree call.
func (m *Machine) settle() error {
	o := m.obs
	defer func() { o.inserted, o.splits, o.removed = o.inserted[:0], o.splits[:0], o.removed[:0] }()
	for _, id := range o.inserted {
		n := m.tree.Node(id)
		m.marks.Put(id, &mark{parent: n.Parent().ID(), node: n})
		m.index(id)
	}
	for _, s := range o.splits {
		if err := m.onSplit(s); err != nil {
			return err
		}
	}
	for _, id := range o.removed {
		m.unprotect(id)
		if err := m.onRemove(id); err != nil {
			return err
		}
	}
	return nil
}

func (m *Machine) index(id policy.NodeID) {
	if n := m.tree.Node(id); n != nil {
		h := n.Hashes()[0]
		m.first[h] = id
		m.marks.Get(id).first = h
	}
}

// onSplit gives the new prefix its share of the cut node's objects and
// markers: a committed object splits now, a pending backup's at its
// commit; a queued spill queues the prefix just before the suffix; an op
// in flight covers both halves.
func (m *Machine) onSplit(s splitEvent) error {
	mc := m.marks.Get(s.suffix)
	if mc == nil {
		return fmt.Errorf("control: split of node %d: no markers (bug)", s.suffix)
	}
	mp := &mark{parent: mc.parent, node: m.tree.Node(s.prefix), spill: mc.spill, spillOp: mc.spillOp, loadOp: mc.loadOp}
	mc.parent = s.prefix
	m.marks.Put(s.prefix, mp)
	m.index(s.prefix)
	m.index(s.suffix)
	pobj := placement.ObjectID(s.prefix)
	if mc.l1 != 0 {
		if err := m.l1.Split(mc.l1, int64(s.at), pobj); err != nil {
			return fmt.Errorf("control: split node %d L1 object: %w", s.suffix, err)
		}
		// NB: the prefix takes the suffix's place under the old parent
		// and has the suffix as its only child: the old parent's count
		// of L1 children is unchanged.
		mp.l1 = pobj
		m.l1Set.add(s.prefix, mp)
		mp.l1Kids = 1
	}
	if mc.l2 != 0 {
		mp.l2 = pobj
		m.l2Set.add(s.prefix, mp)
		mp.l2Kids = 1
		if mc.l2Pending {
			o := m.ops.Get(mc.backupOp)
			o.deferred = append(o.deferred, deferredSplit{suffix: s.suffix, prefix: s.prefix, at: int64(s.at)})
			o.nodes = append(o.nodes, s.prefix)
			mp.l2Pending, mp.backupOp, mp.dropL1 = true, mc.backupOp, mc.dropL1
		} else if err := m.l2.Split(mc.l2, int64(s.at), pobj); err != nil {
			return fmt.Errorf("control: split node %d L2 object: %w", s.suffix, err)
		}
	}
	switch mc.spill {
	case spillQueued:
		i := slices.Index(m.queue, s.suffix)
		m.queue = slices.Insert(m.queue, i, s.prefix)
	case spillPinned, spillGathered:
		o := m.ops.Get(mc.spillOp)
		o.nodes = append(o.nodes, s.prefix)
	}
	if mc.loadOp != 0 {
		o := m.ops.Get(mc.loadOp)
		o.nodes = append(o.nodes, s.prefix)
	}
	return nil
}

// onRemove releases what a node that left the tree held. Eviction and
// prune never remove a node whose backup is pending (the tree refuses) or
// whose spill is pinned (the victim order skips it).
func (m *Machine) onRemove(id policy.NodeID) error {
	k := m.marks.Get(id)
	if k == nil {
		return fmt.Errorf("control: removal of node %d: no markers (bug)", id)
	}
	m.marks.Del(id)
	if m.first[k.first] == id {
		delete(m.first, k.first)
	}
	if k.l1 != 0 {
		if err := m.l1.Release(k.l1); err != nil {
			return fmt.Errorf("control: release L1 of removed node %d: %w", id, err)
		}
		m.setL1(id, k, 0)
	}
	if k.l2 != 0 {
		if k.l2Pending || k.spill == spillPinned || k.loadOp != 0 {
			return fmt.Errorf("control: node %d removed with its L2 object in use (pending %t, spill %d, load op %d) (bug)", id, k.l2Pending, k.spill, k.loadOp)
		}
		if err := m.l2.Release(k.l2); err != nil {
			return fmt.Errorf("control: release L2 of removed node %d: %w", id, err)
		}
		m.setL2(id, k, 0)
	}
	if k.spill == spillQueued {
		if i := slices.Index(m.queue, id); i >= 0 {
			m.queue = slices.Delete(m.queue, i, i+1)
		}
		m.count(cSpillDequeuedByEviction)
	}
	return nil
}

// NodeState is a read-only view of one node, for tests and inspection.
type NodeState struct {
	// ID, Parent, Pages and Hashes describe the node.
	ID, Parent policy.NodeID
	Hashes     []pagehash.Hash
	// Residency is the tree's residency (L1, L2, L3 = durable).
	Residency radix.Residency
	// BackupPending is the tree's replicated backup-pending marker.
	BackupPending bool
	// Locks is the tree's request lock count.
	Locks int
	// Hits and LastAccess are the tree's.
	Hits, LastAccess uint64
	// L1 and L2 are the node's objects (0: none); L2Pending while a
	// backup is in flight.
	L1, L2    placement.ObjectID
	L2Pending bool
	// Spill is "", "queued", "pinned" or "gathered".
	Spill string
	// Loading is set while a load-back is in flight.
	Loading bool
}

// Nodes returns every live node, by id.
func (m *Machine) Nodes() []NodeState {
	out := make([]NodeState, 0, m.marks.Len())
	for _, id := range m.marks.AppendIDs(nil) {
		n, k := m.tree.Node(id), m.marks.Get(id)
		out = append(out, NodeState{
			ID: id, Parent: n.Parent().ID(), Hashes: n.Hashes(),
			Residency: n.Residency(), BackupPending: n.BackupPending(), Locks: n.LockRefs(),
			Hits: n.Hits(), LastAccess: n.LastAccess(),
			L1: k.l1, L2: k.l2, L2Pending: k.l2Pending,
			Spill:   [...]string{"", "queued", "pinned", "gathered"}[k.spill],
			Loading: k.loadOp != 0,
		})
	}
	return out
}

// Free returns the free pages of L1 and of L2 (kind 0).
func (m *Machine) Free() (l1, l2 int64) { return m.l1.FreePages(0), m.l2.FreePages(0) }

// SpillQueue returns the spill queue, in issue order.
func (m *Machine) SpillQueue() []policy.NodeID { return slices.Clone(m.queue) }

// Held returns the held requests, by id.
func (m *Machine) Held() []ReqID {
	var out []ReqID
	for _, id := range sortedKeys(m.reqs) {
		if m.reqs[id].held {
			out = append(out, id)
		}
	}
	return out
}

// CheckInvariants verifies what the Machine keeps beside the tree and the
// placements: every node's key is as long as its objects (never a key
// longer than its pages), the markers and the tree's residency agree, the
// allocators' own invariants hold.
func (m *Machine) CheckInvariants() error {
	if err := m.tree.Check(); err != nil {
		return err
	}
	if err := m.l1.CheckInvariants(); err != nil {
		return err
	}
	if err := m.l2.CheckInvariants(); err != nil {
		return err
	}
	if err := m.checkIndexes(); err != nil {
		return err
	}
	if m.marks.Len() != m.tree.Nodes() {
		return fmt.Errorf("control: %d marked nodes, tree has %d", m.marks.Len(), m.tree.Nodes())
	}
	// expireHolds finds the holds through the reloads' waiters.
	for _, id := range sortedKeys(m.reqs) {
		if r := m.reqs[id]; r.held {
			rl := m.reloads[r.reload]
			if rl == nil || !slices.Contains(rl.waiters, id) {
				return fmt.Errorf("control: request %d is held but not a waiter of a live reload", id)
			}
		}
	}
	for _, id := range m.marks.AppendIDs(nil) {
		n, k := m.tree.Node(id), m.marks.Get(id)
		if n == nil {
			return fmt.Errorf("control: marked node %d is not in the tree", id)
		}
		if n.Residency().Has(1) != (k.l1 != 0 && k.loadOp == 0) {
			return fmt.Errorf("control: node %d residency %s but L1 object %d (load op %d)", id, n.Residency(), k.l1, k.loadOp)
		}
		if n.Residency().Has(2) != (k.l2 != 0 && !k.l2Pending) {
			return fmt.Errorf("control: node %d residency %s but L2 object %d pending %t", id, n.Residency(), k.l2, k.l2Pending)
		}
		if n.BackupPending() != k.l2Pending {
			return fmt.Errorf("control: node %d backup-pending marker %t, L2 pending %t", id, n.BackupPending(), k.l2Pending)
		}
		for _, obj := range []struct {
			a  *placement.Allocator
			id placement.ObjectID
		}{{m.l1, k.l1}, {m.l2, k.l2}} {
			if obj.id == 0 || (obj.a == m.l2 && k.l2Pending) {
				continue
			}
			info, err := obj.a.Object(obj.id)
			if err != nil {
				return fmt.Errorf("control: node %d: %w", id, err)
			}
			if info.Pages != int64(n.Pages()) {
				return fmt.Errorf("control: node %d has %d pages, its object %d has %d", id, n.Pages(), obj.id, info.Pages)
			}
		}
	}
	return nil
}

func plannerByName(name string) (policy.Planner, error) {
	p, err := planner.ByName(name)
	if err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	return p, nil
}

func (o Options) logClock() func() time.Time {
	if o.LogClock != nil {
		return o.LogClock
	}
	return time.Now
}

// PipelineOps returns, per pipeline, the number of ops issued and not yet
// applied: replicated state, so a group sizes every rank's contribution alike.
func (m *Machine) PipelineOps() [NumPipelines]int {
	var n [NumPipelines]int
	for l := range NumPipelines {
		n[l] = len(m.pipelines[l])
	}
	return n
}

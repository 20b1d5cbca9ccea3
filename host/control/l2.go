package control

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/kvtier/kvtier/host/placement"
	"github.com/kvtier/kvtier/host/radix"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/tiers"
)

// backup starts the L1→L2 backup of n: an L2 object reserved through
// evict-to-fit, the backup-pending marker set at this attach, one copy
// op. The marker is cleared only when the frontier commits or rolls back
// the op; request locks stay separate. With dropL1 the node leaves L1 at
// the commit (write-back). It reports whether the backup started.
func (m *Machine) backup(n *radix.Node, dropL1 bool, req ReqID) bool {
	k := m.marks.Get(n.ID())
	if k.l2 != 0 || n.BackupPending() || k.l1 == 0 || k.loadOp != 0 {
		return false
	}
	obj := placement.ObjectID(n.ID())
	if !m.reserveL2(obj, int64(n.Pages()), n.ID(), req, "backup") {
		return false
	}
	if err := m.tree.SetBackupPending(n, true); err != nil {
		panic(fmt.Sprintf("control: attach backup of node %d: %v", n.ID(), err))
	}
	o := m.issue(opBackup, PipelineBackup)
	o.obj = obj
	o.node0[0] = n.ID()
	o.nodes = o.node0[:1:1]
	m.setL2(n.ID(), k, obj)
	k.l2Pending, k.backupOp, k.dropL1 = true, o.id, dropL1
	l1, l2 := m.copyRanges(k.l1, obj)
	m.out.copies = append(m.out.copies, Copy{Op: o.id, Dir: ToL2, Node: n.ID(), L1: l1, L2: l2, Depth: n.Depth()})
	m.count(cBackup)
	return true
}

// reserveL2 reserves obj through the allocator's evict-to-fit over the
// L2 victims in the replicated order. Exhaustion is a typed, counted,
// rate-limited skip, never a wait.
func (m *Machine) reserveL2(obj placement.ObjectID, pages int64, exclude policy.NodeID, req ReqID, where string) bool {
	fits := true
	for kind := range m.opts.L2.Kinds {
		fits = fits && m.l2.FreePages(tiers.PayloadKind(kind)) >= pages
	}
	if fits {
		// NB: the common case needs no victim list (EvictToFit would not
		// look at it either), and building one scans every node.
		if err := m.l2.Reserve(obj, pages, m.l2.AllKinds()); err != nil {
			panic(fmt.Sprintf("control: l2 reserve for %s: %v", where, err))
		}
		return true
	}
	deficit := int64(0)
	for kind := range m.opts.L2.Kinds {
		deficit = max(deficit, pages-m.l2.FreePages(tiers.PayloadKind(kind)))
	}
	// NB: rounded down to whole pages.
	ahead := int64(m.opts.EvictAhead * float64(m.l2Pages))
	nodes := m.l2Victims(exclude, deficit+ahead)
	// NB: evict-to-fit gets only the victims that cover the deficit (it
	// validates every victim it is given); the rest are for evict ahead.
	var victims []placement.ObjectID
	for _, id := range nodes {
		if deficit <= 0 {
			break
		}
		k := m.marks.Get(id)
		victims = append(victims, k.l2)
		deficit -= int64(k.node.Pages())
	}
	evicted, err := m.l2.EvictToFit(obj, pages, m.l2.AllKinds(), victims)
	if err != nil {
		if !errors.Is(err, placement.ErrNoSpace) {
			panic(fmt.Sprintf("control: l2 reserve for %s: %v", where, err))
		}
		m.skip(Skip{Reason: SkipExhausted, Where: "l2 reserve for " + where, Req: req, Node: exclude, Pages: int(pages)})
		return false
	}
	for _, id := range nodes[:evicted] {
		m.dropL2(id)
	}
	m.l2EvictAhead(nodes[evicted:], exclude, ahead)
	return true
}

// l2EvictAhead frees about pages more of L2 after an evict-to-fit, best
// effort, from the rest of its victim list (coldest first), so that the
// reservations after it find room without building one. It takes only
// victims whose pages are elsewhere too (L3-durable, or still in L1): an
// eviction ahead of need never loses a page.
func (m *Machine) l2EvictAhead(nodes []policy.NodeID, exclude policy.NodeID, pages int64) {
	for _, id := range nodes {
		if pages <= 0 {
			return
		}
		// NB: an earlier victim's prune may have merged this one away.
		k := m.marks.Get(id)
		if k == nil || k.l2 == 0 || !m.l2Evictable(id, k, exclude) {
			continue
		}
		if n := k.node; !n.Residency().Has(3) && k.l1 == 0 {
			continue
		}
		if err := m.l2.Release(k.l2); err != nil {
			panic(fmt.Sprintf("control: release L2 object of node %d ahead: %v", id, err))
		}
		pages -= int64(k.node.Pages())
		m.dropL2(id)
		m.count(cL2EvictAhead)
	}
}

// l2Evictable reports whether node id (mark k) may leave L2 now: a
// committed object, no child in L2, no request lock, no pending backup, no
// spill pinned by an ungathered put, no load-back reading it; one without
// L1 pages must be a leaf of the tree, since it leaves it.
func (m *Machine) l2Evictable(id policy.NodeID, k *mark, exclude policy.NodeID) bool {
	if id == exclude || k.l2Pending || k.spill == spillPinned || k.loadOp != 0 || k.l2Kids > 0 || m.protected(id) {
		return false
	}
	n := k.node
	return n.LockRefs() == 0 && !n.BackupPending() && (k.l1 != 0 || n.Children() == 0)
}

// l2Victims returns the nodes whose L2 objects may be evicted, coldest
// first (last access, then node id: the replicated order). It reads only
// replicated state: the tree, the markers, the ops in flight. A victim
// holds a committed object, no request lock, no pending backup, no spill
// pinned by an ungathered put, no load-back reading it, and no child in
// L2; one without L1 pages must be a leaf of the tree, since it leaves it.
//
// Only the coldest victims whose pages cover the deficit are returned, in
// order (evict-to-fit stops at the first fit, so it would not look
// further); when all of them do not cover it, all are returned and the
// reservation is exhausted.
func (m *Machine) l2Victims(exclude policy.NodeID, deficit int64) []policy.NodeID {
	h := m.victimBuf[:0]
	for i, id := range m.l2Set.ids {
		k := m.l2Set.marks[i]
		if !m.l2Evictable(id, k, exclude) {
			continue
		}
		n := k.node
		h = append(h, victim{last: n.LastAccess(), id: id, pages: int64(n.Pages())})
	}
	m.victimBuf = h
	// A min-heap popped until the deficit is covered: O(n + k log n)
	// instead of sorting every candidate.
	for i := len(h)/2 - 1; i >= 0; i-- {
		siftDown(h, i)
	}
	var out []policy.NodeID
	for len(h) > 0 && deficit > 0 {
		out = append(out, h[0].id)
		deficit -= h[0].pages
		h[0] = h[len(h)-1]
		h = h[:len(h)-1]
		siftDown(h, 0)
	}
	return out
}

// victim is an L2 eviction candidate in the replicated order.
type victim struct {
	last  uint64
	id    policy.NodeID
	pages int64
}

func (a victim) less(b victim) bool {
	// NB: not cmp.Or of two Compares, which computes both: the heaps of
	// evict ahead and of L2 victims compare on every sift.
	if a.last != b.last {
		return a.last < b.last
	}
	return a.id < b.id
}

func siftDown(h []victim, i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		c := l
		if r := l + 1; r < len(h) && h[r].less(h[l]) {
			c = r
		}
		if !h[c].less(h[i]) {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

// dropL2 tears down a node whose L2 object evict-to-fit released: it keeps
// its L1 pages if it has them, else it leaves the tree. A durable victim
// is just dropped: its pages stay in the Store for a later reload.
func (m *Machine) dropL2(id policy.NodeID) {
	k := m.marks.Get(id)
	n := m.tree.Node(id)
	m.setL2(id, k, 0)
	if k.spill == spillQueued {
		i := slices.Index(m.queue, id)
		m.queue = slices.Delete(m.queue, i, i+1)
		k.spill = spillNone
		m.count(cSpillDequeuedByEviction)
	}
	if n.Residency().Has(3) {
		m.count(cL2EvictDurable)
	} else {
		m.count(cL2EvictNotDurable)
	}
	if k.l1 != 0 {
		m.setResidency(n, n.Residency()&^radix.L2)
		return
	}
	if _, err := m.tree.Prune(n); err != nil {
		panic(fmt.Sprintf("control: drop L2 victim %d: %v", id, err))
	}
	m.mustSettle()
}

// applyBackup commits or rolls back a backup at the frontier: the object
// is committed (and the splits its nodes went through are applied to it),
// the markers cleared, the nodes made L2 resident and queued for spill in
// commit order (prefix halves first); on a failure anywhere the object is
// released and the markers cleared.
func (m *Machine) applyBackup(o *op, ok bool) {
	nodes := slices.Clone(o.nodes)
	slices.SortFunc(nodes, func(a, b policy.NodeID) int {
		return cmp.Or(cmp.Compare(m.tree.Node(a).Depth(), m.tree.Node(b).Depth()), cmp.Compare(a, b))
	})
	if ok {
		if err := m.l2.Commit(o.obj); err != nil {
			panic(fmt.Sprintf("control: commit backup op %d: %v", o.id, err))
		}
		for _, d := range o.deferred {
			if err := m.l2.Split(m.marks.Get(d.suffix).l2, d.at, placement.ObjectID(d.prefix)); err != nil {
				panic(fmt.Sprintf("control: deferred split of node %d: %v", d.suffix, err))
			}
		}
	} else {
		if err := m.l2.Release(o.obj); err != nil {
			panic(fmt.Sprintf("control: roll back backup op %d: %v", o.id, err))
		}
		m.skip(Skip{Reason: SkipFailed, Where: "backup", Op: o.id, Node: o.nodes[0]})
	}
	for _, id := range nodes {
		n, k := m.tree.Node(id), m.marks.Get(id)
		if err := m.tree.SetBackupPending(n, false); err != nil {
			panic(fmt.Sprintf("control: clear backup marker of node %d: %v", id, err))
		}
		k.l2Pending, k.backupOp = false, 0
		drop := k.dropL1
		k.dropL1 = false
		if !ok {
			m.setL2(id, k, 0)
			continue
		}
		m.setResidency(n, n.Residency()|radix.L2)
		if drop && n.LockRefs() > 0 {
			// NB: a request locked the node while its write-back ran; its
			// L1 pages stay until a later eviction (locks are replicated).
			m.count(cWriteBackKeptL1OfALockedNode)
			drop = false
		}
		if drop {
			if err := m.l1.Release(k.l1); err != nil {
				panic(fmt.Sprintf("control: release L1 of written-back node %d: %v", id, err))
			}
			m.setL1(id, k, 0)
			m.setResidency(n, n.Residency()&^radix.L1)
		}
		m.enqueueSpill(id)
	}
	m.retire(o)
}

// enqueueSpill queues a just-committed node for its proactive spill. The
// queue's cap is an option, equal on every rank: a full queue is a skip.
func (m *Machine) enqueueSpill(id policy.NodeID) {
	if !m.opts.L3 || m.tree.Node(id).Residency().Has(3) {
		return
	}
	if len(m.queue) >= m.opts.SpillQueueCap {
		m.skip(Skip{Reason: SkipCapacity, Where: "spill queue", Node: id})
		return
	}
	m.queue = append(m.queue, id)
	m.marks.Get(id).spill = spillQueued
}

// issueSpills issues queued spills in commit order while fewer than
// SpillInflight are in flight. An issued spill pins its node's L2 object
// against eviction until the gathered frontier.
func (m *Machine) issueSpills() {
	for len(m.queue) > 0 && m.inflight < m.opts.SpillInflight {
		if !m.l3Usable() {
			m.skip(Skip{Reason: SkipTierDown, Where: "spill", Node: m.queue[0]})
			return
		}
		id := m.queue[0]
		m.queue = m.queue[1:]
		n, k := m.tree.Node(id), m.marks.Get(id)
		o := m.issue(opSpill, PipelineGather, PipelineDurable)
		o.node0[0] = id
		o.nodes = o.node0[:1:1]
		// NB: no copy: the tree never writes a node's hashes (a split
		// gives the halves new arrays or re-slices a borrowed key).
		o.hashes, o.depth = n.Hashes(), n.Depth()
		k.spill, k.spillOp = spillPinned, o.id
		m.inflight++
		m.out.puts = append(m.out.puts, Put{Op: o.id, Node: id, Hashes: o.hashes, Spans: m.pageSpans(k.l2, len(o.hashes)), Depth: o.depth})
		m.count(cSpill)
	}
}

// pageSpans returns one slab span per page of obj, kind by kind.
func (m *Machine) pageSpans(obj placement.ObjectID, pages int) []tiers.Span {
	// NB: sized for every page of every kind, so that PageSpans, which
	// appends a kind's runs and expands them in place, never grows it.
	room := m.arena.spans.room(pages * len(m.opts.L2.Kinds))
	spans := room
	for kind := range m.opts.L2.Kinds {
		var err error
		if spans, err = m.l2.PageSpans(obj, tiers.PayloadKind(kind), spans); err != nil {
			panic(fmt.Sprintf("control: spans of object %d: %v", obj, err))
		}
	}
	return m.arena.spans.keep(room, spans)
}

// applyGather releases the eviction pin of a spill at the gathered
// frontier: the Store has the pages off the slab on every rank.
func (m *Machine) applyGather(o *op, ok bool) {
	o.gatherFailed = !ok
	for _, id := range o.nodes {
		if k := m.marks.Get(id); k != nil && k.spillOp == o.id {
			k.spill = spillGathered
		}
	}
}

// applyDurable marks a spill's nodes durable (L3) at the durable frontier,
// only if it was gathered and written on every rank (ok-AND); otherwise it
// is durable nowhere and every rank deletes what it may have written.
func (m *Machine) applyDurable(o *op, ok bool) {
	ok = ok && !o.gatherFailed
	for _, id := range o.nodes {
		k := m.marks.Get(id)
		if k == nil || k.spillOp != o.id {
			continue
		}
		k.spill, k.spillOp = spillNone, 0
		if ok {
			n := m.tree.Node(id)
			m.setResidency(n, n.Residency()|radix.L3)
		}
	}
	if !ok {
		m.out.deletes = append(m.out.deletes, Delete{Op: o.id, Hashes: o.hashes, Depth: o.depth})
		m.skip(Skip{Reason: SkipFailed, Where: "spill", Op: o.id, Node: o.nodes[0]})
	} else {
		m.count(cSpillDurable)
	}
	m.inflight--
	m.retire(o)
}

package control

import (
	"fmt"
	"math"

	"github.com/kvtier/kvtier/host/placement"
	"github.com/kvtier/kvtier/host/radix"
	"github.com/kvtier/kvtier/policy"
)

// admitL1 makes room for need pages in L1. The hard deficit (need minus
// the free pages) gates: when the owner-lane plan cannot free it, nothing
// is evicted and the admission is skipped (capacity). The free-room
// watermark is pursued best effort: the plan aims at need plus the
// watermark, and a shortfall is a counted, rate-limited skip, never a
// failure (the seed's log storm came from a watermark that could not be
// met). An admission that had to plan then frees EvictAhead of L1 more,
// best effort too, so that the next ones find room without a plan. It
// reports whether need pages are free afterwards.
func (m *Machine) admitL1(need int64, req ReqID, node policy.NodeID) bool {
	m.count(cL1Admit)
	free := m.l1.FreePages(0)
	water := int64(math.Ceil(m.opts.FreeRoomRatio * float64(m.opts.L1Pages)))
	target := need + water - free
	if target <= 0 {
		return true
	}
	m.count(cL1Plan)
	hard := need - free
	plan, err := m.plan.Plan(m.planInput(target))
	if err != nil {
		// NB: the input is built from the tree; a refusal is a bug, but a
		// cache may always miss: skip rather than stop.
		m.count(cL1PlanError)
		m.skip(Skip{Reason: SkipCapacity, Where: "l1 admit", Req: req, Node: node, Pages: int(need)})
		return false
	}
	planned := int64(0)
	for _, f := range plan.Freed {
		planned += int64(f)
	}
	if hard > 0 && planned < hard {
		m.skip(Skip{Reason: SkipCapacity, Where: "l1 admit", Req: req, Node: node, Pages: int(need)})
		return false
	}
	for _, id := range plan.Victims {
		if n := m.tree.Node(id); n != nil {
			m.evictL1(n)
		}
	}
	// NB: rounded down to whole pages.
	if ahead := int64(m.opts.EvictAhead * float64(m.opts.L1Pages)); ahead > 0 {
		m.evictAhead(ahead)
	}
	free = m.l1.FreePages(0)
	if free < need {
		// Write-back victims free their pages at their backup's commit.
		m.skip(Skip{Reason: SkipCapacity, Where: "l1 admit", Req: req, Node: node, Pages: int(need)})
		return false
	}
	if free-need < water {
		m.skip(Skip{Reason: SkipWatermark, Where: "l1 admit", Req: req, Node: node, Pages: int(water - (free - need))})
	}
	return true
}

// evictAhead takes about pages more pages out of L1, best effort: the
// coldest evictable L1 leaves first (last access, then node id: the
// replicated order), until their pages cover it.
func (m *Machine) evictAhead(pages int64) {
	h := m.victimBuf[:0]
	for i, id := range m.l1Set.ids {
		k := m.l1Set.marks[i]
		n := k.node
		if k.loadOp != 0 || k.l1Kids > 0 || n.LockRefs() != 0 || n.BackupPending() {
			continue
		}
		h = append(h, victim{last: n.LastAccess(), id: id, pages: int64(n.Pages())})
	}
	for i := len(h)/2 - 1; i >= 0; i-- {
		siftDown(h, i)
	}
	for len(h) > 0 && pages > 0 {
		v := h[0]
		h[0] = h[len(h)-1]
		h = h[:len(h)-1]
		siftDown(h, 0)
		// NB: an earlier victim's prune may have merged this one away.
		if n, k := m.tree.Node(v.id), m.marks.Get(v.id); n != nil && k != nil && k.l1 != 0 {
			m.evictL1(n)
			pages -= v.pages
			m.count(cL1EvictAhead)
		}
	}
	m.victimBuf = h[:0]
}

// planInput describes every node resident in L1 to the owner-lane
// planner: its L1 children (a node is an L1 leaf when none of its children
// holds L1 pages), whether it may leave L1 (no request lock, no pending
// backup: markers only), its pages, and its last access as the priority.
//
// The deficit is one lane's, whatever the group's owner lanes: every rank
// reserves a node's whole L1 object (docs/consensus.md, "Owner lanes"), so
// a victim's pages in any lane are room in the one pool that must have it.
// Split by owner (target/cp each) the plan had to free a lane's share from
// that lane's pages; the L1 leaves of `kvtier sim --ranks 8` often held
// none of lane 0's, so such plans fell short of the hard deficit and
// nearly every admission was skipped (capacity).
func (m *Machine) planInput(target int64) policy.PlanInput {
	in := policy.PlanInput{Deficits: []int{int(target)}}
	// NB: the set's order is its replicated history; the plan depends on
	// the nodes given, not on their order (every score is total).
	in.Nodes = m.planBuf[:0]
	counts := m.countBuf[:0]
	for i, id := range m.l1Set.ids {
		k := m.l1Set.marks[i]
		if k.loadOp != 0 {
			continue
		}
		n := k.node
		at := len(counts)
		counts = append(counts, n.Pages())
		in.Nodes = append(in.Nodes, policy.PlanNode{
			ID:        id,
			Parent:    k.parent,
			Children:  k.l1Kids,
			Evictable: n.LockRefs() == 0 && !n.BackupPending(),
			// NB: a later append may move the buffer; the slices taken
			// keep the old array, which is all the plan needs.
			Counts:   counts[at : at+1 : at+1],
			Priority: n.LastAccess(),
		})
	}
	m.planBuf, m.countBuf = in.Nodes, counts
	return in
}

// evictL1 takes a planned victim out of L1. A node backed up in L2 just
// loses its L1 pages. One that is not is backed up first (write_back, or a
// node with children, which cannot leave the tree alone) and leaves L1 at
// the backup's commit; a leaf without a backup leaves the tree.
func (m *Machine) evictL1(n *radix.Node) {
	k := m.marks.Get(n.ID())
	switch {
	case n.Residency().Has(2):
		if err := m.l1.Release(k.l1); err != nil {
			panic(fmt.Sprintf("control: release L1 object of node %d: %v", n.ID(), err))
		}
		m.setL1(n.ID(), k, 0)
		m.setResidency(n, n.Residency()&^radix.L1)
		m.count(cL1EvictToL2)
	case m.opts.WritePolicy == WriteBack || n.Children() > 0:
		if m.backup(n, true, 0) {
			m.count(cL1EvictWriteBack)
		}
	default:
		if _, err := m.tree.Prune(n); err != nil {
			panic(fmt.Sprintf("control: drop L1 leaf %d: %v", n.ID(), err))
		}
		m.mustSettle()
		m.count(cL1EvictDrop)
	}
}

// reserveL1 places an L1 object of pages pages for node; admission made
// room, so it fits.
func (m *Machine) reserveL1(node policy.NodeID, pages int64) placement.ObjectID {
	obj := placement.ObjectID(node)
	if err := m.l1.Reserve(obj, pages, m.l1.AllKinds()); err != nil {
		panic(fmt.Sprintf("control: reserve L1 for node %d after admission: %v", node, err))
	}
	if err := m.l1.Commit(obj); err != nil {
		panic(fmt.Sprintf("control: commit L1 for node %d: %v", node, err))
	}
	return obj
}

// loadBack brings the L2-resident nodes that follow the path's L1-resident
// prefix into L1: one admission for all their pages, one op, a copy per
// node. The path is locked by the request, so admission never evicts it.
// It returns the pages being loaded back.
func (m *Machine) loadBack(req ReqID, path []*radix.Node) int {
	i := 0
	for i < len(path) && path[i].Residency().Has(1) {
		i++
	}
	var nodes []*radix.Node
	need := int64(0)
	for _, n := range path[i:] {
		k := m.marks.Get(n.ID())
		if !n.Residency().Has(2) || k.l1 != 0 || k.loadOp != 0 {
			break
		}
		nodes = append(nodes, n)
		need += int64(n.Pages())
	}
	if len(nodes) == 0 {
		return 0
	}
	if !m.admitL1(need, req, nodes[0].ID()) {
		return 0
	}
	o := m.issue(opLoadBack, PipelineLoadBack)
	for _, n := range nodes {
		k := m.marks.Get(n.ID())
		m.setL1(n.ID(), k, m.reserveL1(n.ID(), int64(n.Pages())))
		k.loadOp = o.id
		o.nodes = append(o.nodes, n.ID())
		l1, l2 := m.copyRanges(k.l1, k.l2)
		m.out.copies = append(m.out.copies, Copy{Op: o.id, Dir: ToL1, Node: n.ID(), L1: l1, L2: l2, Depth: n.Depth()})
	}
	m.count(cLoadBack)
	return int(need)
}

// applyLoadBack applies a load-back at the frontier: its nodes become L1
// resident, or, when it failed on some rank, give their L1 pages back.
func (m *Machine) applyLoadBack(o *op, ok bool) {
	for _, id := range o.nodes {
		k := m.marks.Get(id)
		n := m.tree.Node(id)
		if k == nil || k.loadOp != o.id {
			continue
		}
		k.loadOp = 0
		if ok {
			m.setResidency(n, n.Residency()|radix.L1)
			continue
		}
		if err := m.l1.Release(k.l1); err != nil {
			panic(fmt.Sprintf("control: release L1 of failed load-back node %d: %v", id, err))
		}
		m.setL1(id, k, 0)
	}
	if !ok {
		m.skip(Skip{Reason: SkipFailed, Where: "load-back", Op: o.id})
	}
	m.retire(o)
}

// copyRanges returns the ranges of a copy's L1 and L2 objects, cut from
// one array.
func (m *Machine) copyRanges(l1, l2 placement.ObjectID) ([]placement.Range, []placement.Range) {
	room := m.arena.ranges.room(8)
	rs, err := m.l1.AppendRanges(room, l1)
	if err != nil {
		panic(fmt.Sprintf("control: L1 object %d: %v", l1, err))
	}
	n := len(rs)
	if rs, err = m.l2.AppendRanges(rs, l2); err != nil {
		panic(fmt.Sprintf("control: L2 object %d: %v", l2, err))
	}
	rs = m.arena.ranges.keep(room, rs)
	return rs[:n:n], rs[n:]
}

func (m *Machine) setResidency(n *radix.Node, r radix.Residency) {
	if err := m.tree.SetResidency(n, r); err != nil {
		panic(fmt.Sprintf("control: set residency of node %d: %v", n.ID(), err))
	}
}

func (m *Machine) mustSettle() {
	if err := m.settle(); err != nil {
		panic(err.Error())
	}
}

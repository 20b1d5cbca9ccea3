package control

import (
	"fmt"
	"slices"

	"github.com/kvtier/kvtier/host/placement"
	"github.com/kvtier/kvtier/policy"
)

// nodeSet is a set of node ids with O(1) add and delete and iteration in
// an order that depends only on the history of adds and deletes (so it is
// the same on every replica).
type nodeSet struct {
	ids   []policy.NodeID
	marks []*mark // marks[i] is ids[i]'s
	pos   map[policy.NodeID]int
}

func newNodeSet() nodeSet { return nodeSet{pos: map[policy.NodeID]int{}} }

func (s *nodeSet) add(id policy.NodeID, k *mark) {
	if _, ok := s.pos[id]; ok {
		return
	}
	s.pos[id] = len(s.ids)
	s.ids = append(s.ids, id)
	s.marks = append(s.marks, k)
}

func (s *nodeSet) del(id policy.NodeID) {
	i, ok := s.pos[id]
	if !ok {
		return
	}
	n := len(s.ids) - 1
	last := s.ids[n]
	s.ids[i], s.marks[i] = last, s.marks[n]
	s.pos[last] = i
	s.ids, s.marks = s.ids[:n], s.marks[:n]
	delete(s.pos, id)
}

// setL1 sets a node's L1 object (0: none) and keeps the L1 indexes.
func (m *Machine) setL1(id policy.NodeID, k *mark, obj placement.ObjectID) {
	had, has := k.l1 != 0, obj != 0
	k.l1 = obj
	if had != has {
		m.indexSet(&m.l1Set, id, k, has, func(p *mark) *int { return &p.l1Kids })
	}
}

// setL2 sets a node's L2 object (0: none) and keeps the L2 indexes.
func (m *Machine) setL2(id policy.NodeID, k *mark, obj placement.ObjectID) {
	had, has := k.l2 != 0, obj != 0
	k.l2 = obj
	if !has {
		m.unprotect(id)
	}
	if had != has {
		m.indexSet(&m.l2Set, id, k, has, func(p *mark) *int { return &p.l2Kids })
	}
}

func (m *Machine) indexSet(s *nodeSet, id policy.NodeID, k *mark, has bool, kids func(*mark) *int) {
	// NB: the root (0) has no mark; a removed parent (prune goes deepest
	// first, so only after its children) has none either.
	p := m.marks.Get(k.parent)
	if has {
		s.add(id, k)
		if p != nil {
			*kids(p)++
		}
		return
	}
	s.del(id)
	if p != nil {
		*kids(p)--
	}
}

// checkIndexes recomputes the derived indexes from the markers and the
// tree and compares.
func (m *Machine) checkIndexes() error {
	for _, tier := range []struct {
		name string
		set  *nodeSet
		kids func(*mark) int
		has  func(*mark) bool
	}{
		{"L1", &m.l1Set, func(k *mark) int { return k.l1Kids }, func(k *mark) bool { return k.l1 != 0 }},
		{"L2", &m.l2Set, func(k *mark) int { return k.l2Kids }, func(k *mark) bool { return k.l2 != 0 }},
	} {
		want := map[policy.NodeID]int{}
		var ids []policy.NodeID
		for _, id := range m.marks.AppendIDs(nil) {
			k := m.marks.Get(id)
			if k.node != m.tree.Node(id) {
				return fmt.Errorf("control: node %d: marker points at another node", id)
			}
			if p := m.tree.Node(id).Parent().ID(); p != k.parent {
				return fmt.Errorf("control: node %d parent %d, marker says %d", id, p, k.parent)
			}
			if tier.has(k) {
				ids = append(ids, id)
				want[k.parent]++
			}
		}
		got := slices.Clone(tier.set.ids)
		slices.Sort(got)
		if !slices.Equal(got, ids) {
			return fmt.Errorf("control: %s set %v, markers say %v", tier.name, got, ids)
		}
		for i, id := range tier.set.ids {
			if tier.set.marks[i] != m.marks.Get(id) || tier.set.pos[id] != i {
				return fmt.Errorf("control: %s set entry %d (node %d) out of date", tier.name, i, id)
			}
		}
		for _, id := range m.marks.AppendIDs(nil) {
			if n := tier.kids(m.marks.Get(id)); n != want[id] {
				return fmt.Errorf("control: node %d has %d %s children, index says %d", id, want[id], tier.name, n)
			}
		}
	}
	return nil
}

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
	ids []policy.NodeID
	pos map[policy.NodeID]int
}

func newNodeSet() nodeSet { return nodeSet{pos: map[policy.NodeID]int{}} }

func (s *nodeSet) add(id policy.NodeID) {
	if _, ok := s.pos[id]; ok {
		return
	}
	s.pos[id] = len(s.ids)
	s.ids = append(s.ids, id)
}

func (s *nodeSet) del(id policy.NodeID) {
	i, ok := s.pos[id]
	if !ok {
		return
	}
	last := s.ids[len(s.ids)-1]
	s.ids[i] = last
	s.pos[last] = i
	s.ids = s.ids[:len(s.ids)-1]
	delete(s.pos, id)
}

// setL1 sets a node's L1 object (0: none) and keeps the L1 indexes.
func (m *Machine) setL1(id policy.NodeID, k *mark, obj placement.ObjectID) {
	had, has := k.l1 != 0, obj != 0
	k.l1 = obj
	if had != has {
		m.indexSet(&m.l1Set, m.l1Kids, id, k.parent, has)
	}
}

// setL2 sets a node's L2 object (0: none) and keeps the L2 indexes.
func (m *Machine) setL2(id policy.NodeID, k *mark, obj placement.ObjectID) {
	had, has := k.l2 != 0, obj != 0
	k.l2 = obj
	if had != has {
		m.indexSet(&m.l2Set, m.l2Kids, id, k.parent, has)
	}
}

func (m *Machine) indexSet(s *nodeSet, kids map[policy.NodeID]int, id, parent policy.NodeID, has bool) {
	if has {
		s.add(id)
		kids[parent]++
		return
	}
	s.del(id)
	if kids[parent]--; kids[parent] <= 0 {
		delete(kids, parent)
	}
}

// checkIndexes recomputes the derived indexes from the markers and the
// tree and compares.
func (m *Machine) checkIndexes() error {
	for _, tier := range []struct {
		name string
		set  *nodeSet
		kids map[policy.NodeID]int
		has  func(*mark) bool
	}{
		{"L1", &m.l1Set, m.l1Kids, func(k *mark) bool { return k.l1 != 0 }},
		{"L2", &m.l2Set, m.l2Kids, func(k *mark) bool { return k.l2 != 0 }},
	} {
		want := map[policy.NodeID]int{}
		var ids []policy.NodeID
		for _, id := range sortedKeys(m.marks) {
			k := m.marks[id]
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
		for id, n := range want {
			if tier.kids[id] != n {
				return fmt.Errorf("control: node %d has %d %s children, index says %d", id, n, tier.name, tier.kids[id])
			}
		}
		if len(tier.kids) != len(want) {
			return fmt.Errorf("control: %s child index has %d entries, want %d", tier.name, len(tier.kids), len(want))
		}
	}
	return nil
}

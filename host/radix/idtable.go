package radix

import "github.com/kvtier/kvtier/policy"

// idTable maps the ids of live nodes to nodes. Ids are handed out in
// increasing order and most lookups (victims, new nodes) are of recent
// ids, so recent ids live in a slice indexed by id - base and only old
// survivors (a hot system prompt that never leaves) move to a map. Memory
// stays O(live nodes): when the slice spans more than four times the
// live nodes it holds, its older half moves its survivors to the map.
type idTable struct {
	base   policy.NodeID // id of recent[0]
	recent []*Node
	// inRecent counts the non-nil entries of recent.
	inRecent int
	old      map[policy.NodeID]*Node
}

func newIDTable(first policy.NodeID) idTable {
	return idTable{base: first, old: make(map[policy.NodeID]*Node)}
}

// len returns the number of live nodes.
func (t *idTable) len() int { return t.inRecent + len(t.old) }

func (t *idTable) get(id policy.NodeID) *Node {
	if id >= t.base {
		if i := id - t.base; i < policy.NodeID(len(t.recent)) {
			return t.recent[i]
		}
		return nil
	}
	return t.old[id]
}

// add records n, whose id is the highest so far.
func (t *idTable) add(n *Node) {
	i := n.id - t.base
	for policy.NodeID(len(t.recent)) < i {
		t.recent = append(t.recent, nil)
	}
	t.recent = append(t.recent, n)
	t.inRecent++
	if len(t.recent) > 64 && len(t.recent) > 4*t.inRecent {
		t.age()
	}
}

func (t *idTable) del(id policy.NodeID) {
	if id < t.base {
		delete(t.old, id)
		return
	}
	i := id - t.base
	if i >= policy.NodeID(len(t.recent)) || t.recent[i] == nil {
		return
	}
	t.recent[i] = nil
	t.inRecent--
	// Drop leading holes so base follows the oldest recent survivor.
	k := 0
	for k < len(t.recent) && t.recent[k] == nil {
		k++
	}
	if k > 0 && (k == len(t.recent) || k >= 64) {
		t.shift(k)
	}
}

// age moves the survivors of the older half of recent to the map.
func (t *idTable) age() {
	half := len(t.recent) / 2
	for _, n := range t.recent[:half] {
		if n != nil {
			t.old[n.id] = n
			t.inRecent--
		}
	}
	t.shift(half)
}

// shift drops the first k entries of recent (all nil or already moved).
func (t *idTable) shift(k int) {
	t.base += policy.NodeID(k)
	// NB: copy into a fresh slice now and then, so the dropped prefix's
	// memory is released rather than kept behind the slice's start.
	if cap(t.recent) > 2*(len(t.recent)-k)+64 {
		t.recent = append(make([]*Node, 0, 2*(len(t.recent)-k)+64), t.recent[k:]...)
		return
	}
	t.recent = t.recent[k:]
}

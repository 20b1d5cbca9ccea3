// Package leafheap holds the data structures the built-in eviction policies
// of kvtier are made of: a Table that maps node ids to dense slots (reused
// after removal, so memory follows the live node count, not the number of
// nodes ever created), an indexed min-heap over slots keyed by a total order
// (Key.A, Key.B, node id), and Protection, the capped protected segment of
// the segmented-LRU core (policy/internal/segmented).
//
// Both are plain deterministic values: no goroutines, no clock, no map
// iteration. In steady state (slots and heap capacity already grown) no
// operation allocates. The package must never grow a policy decision of its
// own; it only orders what a policy keys.
package leafheap

import "github.com/kvtier/kvtier/policy"

// Key is the policy-defined part of a heap order; entries compare by A, then
// B, then node id, so every order is total.
type Key struct {
	// A is the most significant component.
	A uint64
	// B breaks ties in A.
	B uint64
}

// Less reports whether (k, a) orders before (o, b).
func (k Key) Less(a policy.NodeID, o Key, b policy.NodeID) bool {
	if k.A != o.A {
		return k.A < o.A
	}
	if k.B != o.B {
		return k.B < o.B
	}
	return a < b
}

type entry struct {
	key  Key
	id   policy.NodeID
	slot int32
}

// Heap is an indexed binary min-heap of slots. A slot is in the heap at most
// once; Fix and Remove find it in O(1) through the position index.
type Heap struct {
	e []entry
	// pos[slot] is 1 + the slot's index in e, 0 when absent, so a grown
	// index needs no initialisation.
	pos []int32
}

// Len returns the number of entries.
func (h *Heap) Len() int { return len(h.e) }

// Contains reports whether slot is in the heap.
func (h *Heap) Contains(slot int32) bool {
	return int(slot) < len(h.pos) && h.pos[slot] != 0
}

// Key returns slot's key; ok is false when slot is absent.
func (h *Heap) Key(slot int32) (Key, bool) {
	if !h.Contains(slot) {
		return Key{}, false
	}
	return h.e[h.pos[slot]-1].key, true
}

// Set inserts slot with key, or moves it to key if already present.
func (h *Heap) Set(slot int32, id policy.NodeID, key Key) {
	if int(slot) >= len(h.pos) {
		n := max(int(slot)+1, 2*len(h.pos))
		if n <= cap(h.pos) {
			h.pos = h.pos[:n]
		} else {
			grown := make([]int32, n)
			copy(grown, h.pos)
			h.pos = grown
		}
	}
	if p := h.pos[slot]; p != 0 {
		i := int(p - 1)
		old := h.e[i].key
		h.e[i].key = key
		if key.Less(id, old, id) {
			h.up(i)
		} else {
			h.down(i)
		}
		return
	}
	h.e = append(h.e, entry{key: key, id: id, slot: slot})
	i := len(h.e) - 1
	h.pos[slot] = int32(i + 1)
	h.up(i)
}

// Remove takes slot out of the heap; it is a no-op when slot is absent.
func (h *Heap) Remove(slot int32) {
	if !h.Contains(slot) {
		return
	}
	i := int(h.pos[slot] - 1)
	last := len(h.e) - 1
	h.pos[slot] = 0
	if i != last {
		h.e[i] = h.e[last]
		h.pos[h.e[i].slot] = int32(i + 1)
		h.e = h.e[:last]
		if !h.up(i) {
			h.down(i)
		}
		return
	}
	h.e = h.e[:last]
}

// Min returns the least entry's slot, id and key; ok is false when empty.
func (h *Heap) Min() (slot int32, id policy.NodeID, key Key, ok bool) {
	if len(h.e) == 0 {
		return 0, 0, Key{}, false
	}
	e := h.e[0]
	return e.slot, e.id, e.key, true
}

// Clear empties the heap, keeping its storage.
func (h *Heap) Clear() {
	for _, e := range h.e {
		h.pos[e.slot] = 0
	}
	h.e = h.e[:0]
}

func (h *Heap) less(i, j int) bool {
	return h.e[i].key.Less(h.e[i].id, h.e[j].key, h.e[j].id)
}

func (h *Heap) swap(i, j int) {
	h.e[i], h.e[j] = h.e[j], h.e[i]
	h.pos[h.e[i].slot] = int32(i + 1)
	h.pos[h.e[j].slot] = int32(j + 1)
}

// up sifts i toward the root and reports whether it moved.
func (h *Heap) up(i int) bool {
	moved := false
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			break
		}
		h.swap(i, p)
		i = p
		moved = true
	}
	return moved
}

func (h *Heap) down(i int) {
	n := len(h.e)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			return
		}
		h.swap(i, m)
		i = m
	}
}

// Check verifies the heap property and the position index; it returns a
// description of the first violation, or "" when the heap is sound. Tests
// and the invariants build call it.
func (h *Heap) Check() string {
	for i := range h.e {
		if h.pos[h.e[i].slot] != int32(i+1) {
			return "position index disagrees with entry order"
		}
		if i > 0 && h.less(i, (i-1)/2) {
			return "child orders before its parent"
		}
	}
	n := 0
	for _, p := range h.pos {
		if p != 0 {
			n++
		}
	}
	if n != len(h.e) {
		return "position index counts a different number of entries"
	}
	return ""
}

// Table maps node ids to dense slots holding a T per live node. Removed
// slots are reused, so its size follows the number of live nodes.
type Table[T any] struct {
	index idIndex
	vals  []T
	ids   []policy.NodeID
	free  []int32
}

// NewTable returns an empty table.
func NewTable[T any]() *Table[T] {
	return &Table[T]{index: idIndex{old: make(map[policy.NodeID]int32)}}
}

// Len returns the number of live nodes.
func (t *Table[T]) Len() int { return t.index.len() }

// Lookup returns id's slot.
func (t *Table[T]) Lookup(id policy.NodeID) (int32, bool) { return t.index.get(id) }

// Add returns id's slot, allocating a zeroed one when id is new; fresh
// reports whether it was new.
func (t *Table[T]) Add(id policy.NodeID) (slot int32, fresh bool) {
	if s, ok := t.index.get(id); ok {
		return s, false
	}
	if n := len(t.free); n > 0 {
		slot = t.free[n-1]
		t.free = t.free[:n-1]
		t.ids[slot] = id
	} else {
		var zero T
		slot = int32(len(t.vals))
		t.vals = append(t.vals, zero)
		t.ids = append(t.ids, id)
	}
	t.index.put(id, slot)
	return slot, true
}

// Delete frees id's slot, zeroing its value, and returns it.
func (t *Table[T]) Delete(id policy.NodeID) (int32, bool) {
	s, ok := t.index.get(id)
	if !ok {
		return 0, false
	}
	t.index.del(id)
	var zero T
	t.vals[s] = zero
	t.ids[s] = 0
	t.free = append(t.free, s)
	return s, true
}

// At returns the value stored at slot.
func (t *Table[T]) At(slot int32) *T { return &t.vals[slot] }

// ID returns the node id stored at slot.
func (t *Table[T]) ID(slot int32) policy.NodeID { return t.ids[slot] }

// idIndex maps live node ids to slots. The tree hands ids out in
// increasing order and most events name recent ids, so ids from base on
// live in a slice indexed by id - base (slot + 1, 0 for none) and only old
// survivors (a system prompt that never leaves) move to a map, as in the
// radix tree's own id table. Memory stays O(live ids): when the slice
// spans more than four times the ids it holds, the survivors of its older
// half move to the map. An id below base that was never seen goes
// straight to the map.
type idIndex struct {
	base     policy.NodeID // id of recent[0]
	recent   []int32
	inRecent int
	old      map[policy.NodeID]int32
}

func (x *idIndex) len() int { return x.inRecent + len(x.old) }

func (x *idIndex) get(id policy.NodeID) (int32, bool) {
	if id >= x.base {
		if i := id - x.base; i < policy.NodeID(len(x.recent)) {
			if v := x.recent[i]; v != 0 {
				return v - 1, true
			}
		}
		if len(x.old) == 0 {
			return 0, false
		}
	}
	// NB: the map holds old ids and ids that came far ahead of base.
	s, ok := x.old[id]
	return s, ok
}

// put records id (not present) at slot.
func (x *idIndex) put(id policy.NodeID, slot int32) {
	if len(x.recent) == 0 && x.inRecent == 0 && id >= x.base {
		// NB: an empty slice may restart anywhere at or above base.
		x.base = id
	}
	if id < x.base || id-x.base > policy.NodeID(4*x.inRecent+1024) {
		// An old id, or one far ahead of the recent ones (ids need
		// not be dense): keep it in the map rather than span the gap.
		x.old[id] = slot
		return
	}
	i := int(id - x.base)
	for len(x.recent) <= i {
		x.recent = append(x.recent, 0)
	}
	x.recent[i] = slot + 1
	x.inRecent++
	if len(x.recent) > 64 && len(x.recent) > 4*x.inRecent {
		x.age()
	}
}

func (x *idIndex) del(id policy.NodeID) {
	if id < x.base || id-x.base >= policy.NodeID(len(x.recent)) || x.recent[id-x.base] == 0 {
		delete(x.old, id)
		return
	}
	x.recent[id-x.base] = 0
	x.inRecent--
	// Drop leading holes so base follows the oldest recent survivor.
	k := 0
	for k < len(x.recent) && x.recent[k] == 0 {
		k++
	}
	if k > 0 && (k == len(x.recent) || k >= 64) {
		x.shift(k)
	}
}

// age moves the survivors of the older half of recent to the map.
func (x *idIndex) age() {
	half := len(x.recent) / 2
	for i, v := range x.recent[:half] {
		if v != 0 {
			x.old[x.base+policy.NodeID(i)] = v - 1
			x.inRecent--
		}
	}
	x.shift(half)
}

// shift drops the first k entries of recent (all empty or moved).
func (x *idIndex) shift(k int) {
	x.base += policy.NodeID(k)
	// NB: copy into a fresh slice now and then, so the dropped prefix's
	// memory is released rather than kept behind the slice's start.
	if cap(x.recent) > 2*(len(x.recent)-k)+64 {
		x.recent = append(make([]int32, 0, 2*(len(x.recent)-k)+64), x.recent[k:]...)
		return
	}
	x.recent = x.recent[k:]
}

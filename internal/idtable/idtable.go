// Package idtable maps ids handed out in increasing order (radix node ids,
// control op ids) to values, without a map lookup for the recent ones.
//
// Most lookups are of recent ids (new nodes, ops in flight, victims), so
// recent ids live in a slice indexed by id - base and only old survivors
// (a hot system prompt that never leaves) move to a map. Memory stays
// O(live entries): when the slice spans more than four times the entries
// it holds, its older half moves its survivors to the map.
package idtable

import (
	"slices"
)

// Table maps ids to values. The zero value of V means "absent" (V is a
// pointer type in every use). It is not safe for concurrent use.
type Table[K ~uint64, V comparable] struct {
	base   K // id of recent[0]
	recent []V
	// inRecent counts the non-zero entries of recent.
	inRecent int
	old      map[K]V
}

// New returns an empty table whose first id is at least first.
func New[K ~uint64, V comparable](first K) Table[K, V] {
	return Table[K, V]{base: first, old: make(map[K]V)}
}

// Len returns the number of entries.
func (t *Table[K, V]) Len() int { return t.inRecent + len(t.old) }

// Get returns id's value, or the zero value.
func (t *Table[K, V]) Get(id K) V {
	if id >= t.base {
		if i := id - t.base; i < K(len(t.recent)) {
			return t.recent[i]
		}
		var zero V
		return zero
	}
	return t.old[id]
}

// Add records v (not the zero value) for id, which must be higher than
// every id added before; it reports false, changing nothing, when it is
// not (a broken invariant of the caller).
func (t *Table[K, V]) Add(id K, v V) bool {
	var zero V
	if v == zero || id < t.base+K(len(t.recent)) {
		return false
	}
	t.Put(id, v)
	return true
}

// Put records v for id, any id, in place of its value if it has one. The
// zero value deletes. Ids below the slice (older than every recent one) go
// to the map: Put is for callers that add ids a little out of order.
func (t *Table[K, V]) Put(id K, v V) {
	var zero V
	if v == zero {
		t.Del(id)
		return
	}
	if id < t.base {
		t.old[id] = v
		return
	}
	i := id - t.base
	for K(len(t.recent)) <= i {
		t.recent = append(t.recent, zero)
	}
	if t.recent[i] == zero {
		t.inRecent++
	}
	t.recent[i] = v
	if len(t.recent) > 64 && len(t.recent) > 4*t.inRecent {
		t.age()
	}
}

// Del forgets id (absent: nothing).
func (t *Table[K, V]) Del(id K) {
	var zero V
	if id < t.base {
		delete(t.old, id)
		return
	}
	i := id - t.base
	if i >= K(len(t.recent)) || t.recent[i] == zero {
		return
	}
	t.recent[i] = zero
	t.inRecent--
	// Drop leading holes so base follows the oldest recent survivor.
	k := 0
	for k < len(t.recent) && t.recent[k] == zero {
		k++
	}
	if k > 0 && (k == len(t.recent) || k >= 64) {
		t.shift(k)
	}
}

// AppendIDs appends every id, in increasing order, to dst.
func (t *Table[K, V]) AppendIDs(dst []K) []K {
	n := len(dst)
	for id := range t.old {
		dst = append(dst, id)
	}
	slices.Sort(dst[n:])
	var zero V
	for i, v := range t.recent {
		if v != zero {
			dst = append(dst, t.base+K(i))
		}
	}
	return dst
}

// Clear forgets every entry; the next id added must be at least first.
func (t *Table[K, V]) Clear(first K) {
	clear(t.recent)
	t.recent = t.recent[:0]
	t.inRecent = 0
	clear(t.old)
	t.base = first
}

// age moves the survivors of the older half of recent to the map.
func (t *Table[K, V]) age() {
	var zero V
	half := len(t.recent) / 2
	for i, v := range t.recent[:half] {
		if v != zero {
			t.old[t.base+K(i)] = v
			t.inRecent--
		}
	}
	t.shift(half)
}

// shift drops the first k entries of recent (all zero or already moved).
func (t *Table[K, V]) shift(k int) {
	t.base += K(k)
	// NB: copy into a fresh slice now and then, so the dropped prefix's
	// memory is released rather than kept behind the slice's start.
	if cap(t.recent) > 2*(len(t.recent)-k)+64 {
		t.recent = append(make([]V, 0, 2*(len(t.recent)-k)+64), t.recent[k:]...)
		return
	}
	t.recent = t.recent[k:]
}

// recentSpan returns the slots the slice spans and the entries it holds
// (tests: the memory bound).
func (t *Table[K, V]) recentSpan() (slots, held int) { return len(t.recent), t.inRecent }

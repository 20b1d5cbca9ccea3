package adaptive

import "fmt"

// Tags of a ghost entry: which expert's decision evicted the page, or
// that a recall already counted it.
const (
	tagHindsight uint8 = iota
	tagLRU
	tagCounted
)

// ghost remembers the keys of the last limit pages evicted against the
// other expert's advice, each with the tag of the expert that evicted it:
// a FIFO ring (power-of-two length) in eviction order and an
// open-addressed table (linear probing, backward-shift deletion) holding,
// per key, its copies in the ring and the tag of its newest copy. Storage
// grows with the limit by doubling and is then reused, so the steady state
// does not allocate. Key 0 marks an empty slot.
type ghost struct {
	ring  []uint64 // circular, oldest at head
	head  int
	count int

	keys []uint64 // power-of-two table, at most half full
	refs []uint32
	tags []uint8
	used int
}

// add appends k (never 0) with tag as the newest entry and drops the
// oldest while more than limit are remembered. A limit of 0 remembers
// nothing.
func (g *ghost) add(k uint64, tag uint8, limit int) {
	if limit <= 0 {
		return
	}
	if limit > len(g.ring) {
		g.grow(limit)
	}
	mask := len(g.ring) - 1
	for g.count >= limit {
		g.drop(g.ring[g.head])
		g.head = (g.head + 1) & mask
		g.count--
	}
	g.ring[(g.head+g.count)&mask] = k
	g.count++
	i, found := g.find(k)
	if found {
		g.refs[i]++
		g.tags[i] = tag
		return
	}
	g.keys[i], g.refs[i], g.tags[i] = k, 1, tag
	g.used++
}

// take returns the tag of k and marks it counted, so a page recalled twice
// counts once; ok is false when k is not remembered or already counted.
func (g *ghost) take(k uint64) (tag uint8, ok bool) {
	if len(g.keys) == 0 {
		return 0, false
	}
	i, found := g.find(k)
	if !found || g.tags[i] == tagCounted {
		return 0, false
	}
	tag = g.tags[i]
	g.tags[i] = tagCounted
	return tag, true
}

// grow makes room for at least limit keys, keeping their order and tags.
func (g *ghost) grow(limit int) {
	n := max(2*len(g.ring), 64)
	for n < limit {
		n *= 2
	}
	oldKeys, oldTags := g.keys, g.tags
	oldFind := func(k uint64) uint8 {
		if len(oldKeys) == 0 {
			return tagCounted
		}
		mask := len(oldKeys) - 1
		for i := slotOf(k, mask); ; i = (i + 1) & mask {
			switch oldKeys[i] {
			case k:
				return oldTags[i]
			case 0:
				return tagCounted
			}
		}
	}
	ring := make([]uint64, n)
	for i := 0; i < g.count; i++ {
		ring[i] = g.ring[(g.head+i)%len(g.ring)]
	}
	keys, refs, tags := make([]uint64, 2*n), make([]uint32, 2*n), make([]uint8, 2*n)
	g.ring, g.head = ring, 0
	g.keys, g.refs, g.tags, g.used = keys, refs, tags, 0
	for i := 0; i < g.count; i++ {
		k := ring[i]
		j, found := g.find(k)
		if found {
			g.refs[j]++
			continue
		}
		g.keys[j], g.refs[j], g.tags[j] = k, 1, oldFind(k)
		g.used++
	}
}

// slotOf is k's home slot in a table of mask+1 slots: a multiplicative
// hash, since trace ids are sequential.
func slotOf(k uint64, mask int) int {
	return int((k * 0x9e3779b97f4a7c15) >> 32 & uint64(mask))
}

// find returns k's slot and true, or the empty slot where k would go.
func (g *ghost) find(k uint64) (int, bool) {
	mask := len(g.keys) - 1
	for i := slotOf(k, mask); ; i = (i + 1) & mask {
		switch g.keys[i] {
		case k:
			return i, true
		case 0:
			return i, false
		}
	}
}

// drop removes one copy of k.
func (g *ghost) drop(k uint64) {
	i, found := g.find(k)
	if !found {
		return
	}
	if g.refs[i] > 1 {
		g.refs[i]--
		return
	}
	// Backward-shift deletion: pull later entries of the probe run into
	// the hole when their home slot does not lie cyclically in (i, j].
	mask := len(g.keys) - 1
	g.used--
	for {
		g.keys[i], g.refs[i], g.tags[i] = 0, 0, 0
		j := i
		for {
			j = (j + 1) & mask
			if g.keys[j] == 0 {
				return
			}
			h := slotOf(g.keys[j], mask)
			if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
				break
			}
		}
		g.keys[i], g.refs[i], g.tags[i] = g.keys[j], g.refs[j], g.tags[j]
		i = j
	}
}

// check verifies that the table counts exactly the ring's keys; "" when
// it does.
func (g *ghost) check() string {
	if g.count > len(g.ring) || (len(g.keys) > 0 && 2*g.used > len(g.keys)) {
		return fmt.Sprintf("ghost holds %d keys in a ring of %d and %d of %d table slots", g.count, len(g.ring), g.used, len(g.keys))
	}
	var total uint64
	for i, k := range g.keys {
		if k != 0 {
			total += uint64(g.refs[i])
			if j, found := g.find(k); !found || j != i {
				return fmt.Sprintf("ghost key %#x is not reachable from its home slot", k)
			}
		}
	}
	if total != uint64(g.count) {
		return fmt.Sprintf("ghost table counts %d copies, ring holds %d", total, g.count)
	}
	return ""
}

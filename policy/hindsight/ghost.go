package hindsight

import "fmt"

// ghost remembers the keys of the last limit evicted pages: a FIFO ring
// (power-of-two length) in eviction order and an open-addressed multiset (linear probing,
// backward-shift deletion) counting each key's copies in the ring. Its
// storage grows with the limit (by doubling) and is then reused, so steady
// state does not allocate. Key 0 marks an empty slot.
type ghost struct {
	ring  []uint64 // circular, oldest at head
	head  int
	count int

	keys []uint64 // power-of-two table, at most half full
	refs []uint32
	used int
}

// add appends k (never 0) as the newest evicted page and drops the oldest
// while more than limit are remembered. A limit of 0 remembers nothing.
func (g *ghost) add(k uint64, limit int) {
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
		return
	}
	g.keys[i], g.refs[i] = k, 1
	g.used++
}

// has reports whether k is remembered.
func (g *ghost) has(k uint64) bool {
	if len(g.keys) == 0 {
		return false
	}
	_, found := g.find(k)
	return found
}

// grow makes room for at least limit keys, keeping their order.
func (g *ghost) grow(limit int) {
	n := max(2*len(g.ring), 64)
	for n < limit {
		n *= 2
	}
	ring := make([]uint64, n)
	for i := 0; i < g.count; i++ {
		ring[i] = g.ring[(g.head+i)%len(g.ring)]
	}
	g.ring, g.head = ring, 0
	g.keys, g.refs, g.used = make([]uint64, 2*n), make([]uint32, 2*n), 0
	for i := 0; i < g.count; i++ {
		k := ring[i]
		j, found := g.find(k)
		if found {
			g.refs[j]++
			continue
		}
		g.keys[j], g.refs[j] = k, 1
		g.used++
	}
}

// slot0 is k's home slot: a multiplicative hash, since page keys taken
// from hashes are uniform but trace ids are sequential.
func (g *ghost) slot0(k uint64) int {
	return int((k * 0x9e3779b97f4a7c15) >> 32 & uint64(len(g.keys)-1))
}

// find returns k's slot and true, or the empty slot where k would go.
func (g *ghost) find(k uint64) (int, bool) {
	mask := len(g.keys) - 1
	for i := g.slot0(k); ; i = (i + 1) & mask {
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
	// the hole when their home slot does not lie strictly after it.
	mask := len(g.keys) - 1
	g.used--
	for {
		g.keys[i], g.refs[i] = 0, 0
		j := i
		for {
			j = (j + 1) & mask
			if g.keys[j] == 0 {
				return
			}
			h := g.slot0(g.keys[j])
			// Move j into i unless h lies cyclically in (i, j].
			if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
				break
			}
		}
		g.keys[i], g.refs[i] = g.keys[j], g.refs[j]
		i = j
	}
}

// check verifies that the multiset counts exactly the ring's keys; ""
// when it does.
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

// Package ghost holds Table, the bounded memory of evicted pages that
// hindsight (to protect content fetched again) and adaptive (to score the
// duels of its two experts) keep: the keys of the last evicted pages, in
// eviction order, each key with a small tag.
//
// A Table is a plain deterministic value: no goroutines, no clock, no map
// iteration, so replicas fed the same events remember the same pages. The
// package must never grow a policy decision of its own; what a remembered
// page means is the policy's.
package ghost

import (
	"encoding/binary"
	"fmt"

	"github.com/kvtier/kvtier/pagehash"
)

// taken is the tag of a key whose newest copy Take has already returned.
// Policies' tags are below it.
const taken uint8 = 0xff

// Key is the ghost key of a page hash: its first 8 bytes, never 0 (0 marks
// an empty slot).
func Key(h *pagehash.Hash) uint64 {
	return max(binary.LittleEndian.Uint64(h[0:8]), 1)
}

// Table remembers the keys of the last limit evicted pages, each with the
// tag its newest copy was added with: a FIFO ring (power-of-two length) in
// eviction order and an open-addressed table (linear probing,
// backward-shift deletion) holding, per key, its copies in the ring and
// the tag of its newest copy. Storage grows with the limit by doubling and
// is then reused, so the steady state does not allocate. The zero value is
// an empty Table.
//
// Memory: a ring of 8-byte keys and a table of twice the ring's length in
// 13-byte slots, both rounded up to powers of two: at most 68 bytes per
// remembered page.
type Table struct {
	ring  []uint64 // circular, oldest at head
	head  int
	count int

	keys []uint64 // power-of-two table, at most half full; key 0 is empty
	refs []uint32
	tags []uint8
	used int
}

// Len returns the number of pages remembered (copies of a key count
// apiece).
func (g *Table) Len() int { return g.count }

// Add appends k (never 0) with tag (below 0xff) as the newest evicted page
// and drops the oldest while more than limit are remembered. A limit of 0
// remembers nothing. The tag replaces that of older copies of k, and k can
// be taken again.
func (g *Table) Add(k uint64, tag uint8, limit int) {
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
	i, found := find(g.keys, k)
	if found {
		g.refs[i]++
		g.tags[i] = tag
		return
	}
	g.keys[i], g.refs[i], g.tags[i] = k, 1, tag
	g.used++
}

// Has reports whether k is remembered.
func (g *Table) Has(k uint64) bool {
	if len(g.keys) == 0 {
		return false
	}
	_, found := find(g.keys, k)
	return found
}

// Take returns the tag of k and marks k taken, so a page recalled twice
// counts once; ok is false when k is not remembered or already taken
// since its newest Add.
func (g *Table) Take(k uint64) (tag uint8, ok bool) {
	if len(g.keys) == 0 {
		return 0, false
	}
	i, found := find(g.keys, k)
	if !found || g.tags[i] == taken {
		return 0, false
	}
	tag = g.tags[i]
	g.tags[i] = taken
	return tag, true
}

// grow makes room for at least limit keys, keeping their order and tags.
func (g *Table) grow(limit int) {
	n := max(2*len(g.ring), 64)
	for n < limit {
		n *= 2
	}
	oldKeys, oldTags := g.keys, g.tags
	ring := make([]uint64, n)
	for i := 0; i < g.count; i++ {
		ring[i] = g.ring[(g.head+i)%len(g.ring)]
	}
	g.ring, g.head = ring, 0
	g.keys, g.refs, g.tags, g.used = make([]uint64, 2*n), make([]uint32, 2*n), make([]uint8, 2*n), 0
	for i := 0; i < g.count; i++ {
		k := ring[i]
		j, found := find(g.keys, k)
		if found {
			g.refs[j]++
			continue
		}
		// NB: every key of the ring is in the old table, which is
		// therefore not empty here.
		tag := taken
		if o, ok := find(oldKeys, k); ok {
			tag = oldTags[o]
		}
		g.keys[j], g.refs[j], g.tags[j] = k, 1, tag
		g.used++
	}
}

// home is k's home slot in a table of mask+1 slots: a multiplicative hash,
// since page keys taken from hashes are uniform but trace ids are
// sequential.
func home(k uint64, mask int) int {
	return int((k * 0x9e3779b97f4a7c15) >> 32 & uint64(mask))
}

// find returns k's slot in keys (a non-empty power-of-two table with an
// empty slot) and true, or the empty slot where k would go.
func find(keys []uint64, k uint64) (int, bool) {
	mask := len(keys) - 1
	for i := home(k, mask); ; i = (i + 1) & mask {
		switch keys[i] {
		case k:
			return i, true
		case 0:
			return i, false
		}
	}
}

// drop removes one copy of k.
func (g *Table) drop(k uint64) {
	i, found := find(g.keys, k)
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
			h := home(g.keys[j], mask)
			if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
				break
			}
		}
		g.keys[i], g.refs[i], g.tags[i] = g.keys[j], g.refs[j], g.tags[j]
		i = j
	}
}

// Check verifies that the table counts exactly the ring's keys; "" when it
// does.
func (g *Table) Check() string {
	if g.count > len(g.ring) || (len(g.keys) > 0 && 2*g.used > len(g.keys)) {
		return fmt.Sprintf("ghost holds %d keys in a ring of %d and %d of %d table slots", g.count, len(g.ring), g.used, len(g.keys))
	}
	var total uint64
	for i, k := range g.keys {
		if k != 0 {
			total += uint64(g.refs[i])
			if j, found := find(g.keys, k); !found || j != i {
				return fmt.Sprintf("ghost key %#x is not reachable from its home slot", k)
			}
		}
	}
	if total != uint64(g.count) {
		return fmt.Sprintf("ghost table counts %d copies, ring holds %d", total, g.count)
	}
	return ""
}

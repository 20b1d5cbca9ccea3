package control

import (
	"encoding/binary"
	"slices"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
)

// The engine's waiting queue as a hint (EvUpcoming, docs/engine-api.md
// "upcoming"). The engine names the keys of the requests waiting in its
// queue; the Machine keeps their present prefixes in L2 and prefetches
// their missing suffixes from L3 into L2, so that when a request is
// admitted its pages are a load-back away, not a recompute. The offline
// study (docs/policies.md, "The engine's waiting queue as a hint"): the
// next 64 waiting requests protected add 2.65 points of hit rate to
// adaptive at 3M tokens on the shared trace.
//
// What is protected: the L2 objects of the nodes on each hinted key's
// present prefix, found with a peek (no clock tick, no hit: a waiting
// request does not make its pages look recently used). Protection applies
// to L2 eviction only: L1 holds the running requests' pages, and a hint
// never takes L1 room from them. It lasts until the next hint (an empty
// EvUpcoming clears it); a hint stops protecting more keys once the
// protected pages reach UpcomingL2Share of L2, so reservations of the
// running requests always find room.
//
// What is prefetched: for a key whose present prefix is shorter than the
// key, with a Store below the slab, a reload lookup of the missing suffix
// with no waiter (a prefetch). It lands in L2 like any reload; a real
// request that misses the same suffix joins it. A prefetch whose lookup
// found nothing in L3 is not asked again for PrefetchRetryTicks ticks.
// Prefetches take reload slots only while fewer than half of
// ReloadMaxInflight are in flight, so the running requests' reloads keep
// theirs.

// MaxUpcoming is the most keys one hint may name (the engine's next
// waiting requests; the study's knee is 64 to 256).
const MaxUpcoming = 256

// UpcomingL2Share is the share of L2 pages a hint may protect.
const UpcomingL2Share = 0.5

// PrefetchRetryTicks is how long a prefetch that found nothing in L3 is
// not asked again.
const PrefetchRetryTicks = 64

// upcoming applies an EvUpcoming: an empty one clears the hint, one with
// a key adds it.
func (m *Machine) upcoming(e Event) error {
	if len(e.Hashes) == 0 {
		m.clearProtect()
		return nil
	}
	if m.hintKeys >= MaxUpcoming {
		m.count(cUpcomingRefused)
		return nil
	}
	m.hintKeys++
	path, pages := m.tree.PeekHashes(e.Hashes, m.pathB)
	m.pathB = path[:0]
	if err := m.settle(); err != nil {
		return err
	}
	limit := int64(UpcomingL2Share * float64(m.l2Pages))
	for _, n := range path {
		id := n.ID()
		k := m.marks.Get(id)
		if k == nil || k.l2 == 0 || m.protected(id) {
			continue
		}
		if m.protectPages+int64(n.Pages()) > limit {
			m.count(cUpcomingFull)
			break
		}
		m.protect[id] = n.Pages()
		m.protectPages += int64(n.Pages())
		m.count(cUpcomingProtected)
	}
	if pages < len(e.Hashes) {
		m.prefetch(e.Hashes, pages)
	}
	return nil
}

// clearProtect ends the current hint's protection.
func (m *Machine) clearProtect() {
	clear(m.protect)
	m.protectPages = 0
	m.hintKeys = 0
}

// protected reports whether a hint keeps node id in L2.
func (m *Machine) protected(id policy.NodeID) bool {
	_, ok := m.protect[id]
	return ok
}

// unprotect forgets a node that leaves L2 or the tree.
func (m *Machine) unprotect(id policy.NodeID) {
	if pages, ok := m.protect[id]; ok {
		delete(m.protect, id)
		m.protectPages -= int64(pages)
	}
}

// prefetch starts a waiter-less reload of hashes[m0:] (see the package
// comment above).
func (m *Machine) prefetch(hashes []pagehash.Hash, m0 int) {
	if !m.opts.L3 || !m.l3Usable() {
		return
	}
	key := hashes[m0]
	if m.reloads[key] != nil {
		return
	}
	if at, ok := m.prefetchMiss[key]; ok && m.tick < at+PrefetchRetryTicks {
		return
	}
	if len(m.reloads) >= max(1, m.opts.ReloadMaxInflight/2) {
		m.count(cPrefetchBusy)
		return
	}
	full := slices.Clone(hashes)
	rl := &reload{key: key, pre: [][]pagehash.Hash{full[:m0:m0]}, suf: full[m0:], m: m0, prefetch: true}
	o := m.issue(opLookup, PipelineLookup)
	o.hashes, o.depth = rl.suf, m0
	o.reload = key
	rl.op = o.id
	m.reloads[key] = rl
	m.out.lookups = append(m.out.lookups, Lookup{Op: o.id, Hashes: o.hashes, Depth: o.depth})
	m.count(cPrefetchLookup)
}

// prefetchMissed notes a prefetch that found nothing, and forgets misses
// past their retry window.
func (m *Machine) prefetchMissed(key pagehash.Hash) {
	if len(m.prefetchMiss) >= 4*MaxUpcoming {
		for k, at := range m.prefetchMiss {
			if m.tick >= at+PrefetchRetryTicks {
				delete(m.prefetchMiss, k)
			}
		}
	}
	m.prefetchMiss[key] = m.tick
	m.count(cPrefetchMiss)
}

// digestUpcoming appends the hint's replicated state to b (nothing when
// there is none, so digests of Machines that never had a hint are those
// of before hints existed).
func (m *Machine) digestUpcoming(b []byte) []byte {
	if len(m.protect) == 0 && len(m.prefetchMiss) == 0 && m.hintKeys == 0 {
		return b
	}
	u := func(v uint64) { b = binary.LittleEndian.AppendUint64(b, v) }
	b = append(b, "upcoming\n"...)
	u(uint64(m.hintKeys))
	u(uint64(m.protectPages))
	ids := sortedKeys(m.protect)
	u(uint64(len(ids)))
	for _, id := range ids {
		u(uint64(id))
	}
	keys := make([]pagehash.Hash, 0, len(m.prefetchMiss))
	for k := range m.prefetchMiss {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b pagehash.Hash) int { return slices.Compare(a[:], b[:]) })
	u(uint64(len(keys)))
	for _, k := range keys {
		b = append(b, k[:]...)
		u(m.prefetchMiss[k])
	}
	return b
}

package placement

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"math/rand/v2"
	"testing"

	"github.com/kvtier/kvtier/internal/invariants"
	"github.com/kvtier/kvtier/tiers"
)

// machineLayout is control.SimpleLayout(pages, 4096), rebuilt here because
// control imports this package. The host/decisions benchmark's L2 has 4000
// pages.
func machineLayout(pages int64) Layout {
	return Layout{Kinds: []KindLayout{{Name: "kv", PageBytes: 4096, Regions: []Region{{Slab: 0, Offset: 0, Pages: pages}}}}}
}

// machinePattern drives an allocator the way host/control's Machine drives
// its L2 on the Mooncake trace: objects of 1..64 pages (half of them one
// page), ids that grow (node ids) with every fifth one a reload id (bit 62
// set, as control's reloadObjectBase), a reserve followed by its ranges,
// a commit and its spans, aborts, releases of random live objects (prunes
// and load-back drops) and, when a reservation does not fit, evict-to-fit
// over the oldest committed objects followed by an eviction ahead of a
// sixteenth of the capacity. Every return value goes into sum, so a test
// can pin them all.
type machinePattern struct {
	a       *Allocator
	r       *rand.Rand
	live    []liveObject // committed objects, roughly oldest first
	node    ObjectID
	reload  ObjectID
	victims []ObjectID
	ranges  []Range
	spans   []tiers.Span
	sum     hash.Hash
	word    []byte
	// evictions counts evict-to-fit calls, fragmented reservations of
	// several ranges: the run must exercise both.
	evictions, fragmented int
}

// liveObject is a committed object of a machinePattern: the Machine knows
// the pages of its nodes without asking the allocator.
type liveObject struct {
	id    ObjectID
	pages int64
}

func newMachinePattern(tb testing.TB, seed uint64, pages int64, pin bool) *machinePattern {
	a, err := New(machineLayout(pages))
	if err != nil {
		tb.Fatal(err)
	}
	m := &machinePattern{a: a, r: rand.New(rand.NewPCG(seed, 0x6d616368)), node: 1, reload: 1 << 62}
	if pin {
		m.sum = sha256.New()
	}
	return m
}

func (m *machinePattern) put(v int64) {
	if m.sum == nil {
		return
	}
	m.word = binary.LittleEndian.AppendUint64(m.word[:0], uint64(v))
	m.sum.Write(m.word)
}

func (m *machinePattern) putErr(err error) {
	if err != nil && m.sum != nil {
		m.sum.Write([]byte(err.Error()))
	}
}

// step reserves one object and does what the Machine does around it.
func (m *machinePattern) step() {
	a := m.a
	pages := int64(1)
	if m.r.IntN(2) == 0 {
		pages = 1 + m.r.Int64N(64)
	}
	id := m.node
	if m.r.IntN(5) == 0 {
		id, m.reload = m.reload, m.reload+1
	} else {
		m.node++
	}
	if a.FreePages(0) >= pages {
		m.putErr(a.Reserve(id, pages, a.AllKinds()))
	} else {
		deficit := pages - a.FreePages(0)
		m.victims = m.victims[:0]
		for _, v := range m.live {
			if deficit <= 0 {
				break
			}
			m.victims = append(m.victims, v.id)
			deficit -= v.pages
		}
		m.evictions++
		n, err := a.EvictToFit(id, pages, a.AllKinds(), m.victims)
		m.put(int64(n))
		m.putErr(err)
		m.live = m.live[n:]
		if err != nil {
			return
		}
		// Evict ahead: a sixteenth of the capacity from the oldest.
		for ahead := a.total[0] / 16; ahead > 0 && len(m.live) > 0; {
			m.putErr(a.Release(m.live[0].id))
			ahead -= m.live[0].pages
			m.live = m.live[1:]
		}
	}
	var err error
	m.ranges, err = a.AppendRanges(m.ranges[:0], id)
	m.putErr(err)
	if len(m.ranges) > 1 {
		m.fragmented++
	}
	for _, r := range m.ranges {
		m.put(int64(r.Kind))
		m.put(r.Start)
		m.put(r.Pages)
	}
	if m.r.IntN(10) == 0 { // an aborted backup
		m.putErr(a.Release(id))
		return
	}
	m.putErr(a.Commit(id))
	m.spans, err = a.PageSpans(id, 0, m.spans[:0])
	m.putErr(err)
	for _, s := range m.spans {
		m.put(int64(s.Slab))
		m.put(s.Offset)
	}
	m.live = append(m.live, liveObject{id, pages})
	if m.r.IntN(4) != 0 { // a prune or a dropped copy
		i := m.r.IntN(len(m.live))
		m.putErr(a.Release(m.live[i].id))
		// NB: the last takes its place, so the order is only roughly
		// oldest first, but a release costs no copy of the whole list.
		m.live[i] = m.live[len(m.live)-1]
		m.live = m.live[:len(m.live)-1]
	}
	if m.r.IntN(50) == 0 && len(m.live) > 0 { // a radix split
		i := m.r.IntN(len(m.live))
		if v := m.live[i]; v.pages > 1 {
			p, at := m.node, 1+m.r.Int64N(v.pages-1)
			m.node++
			m.putErr(a.Split(v.id, at, p))
			m.live[i].pages -= at
			m.live = append(m.live, liveObject{p, at})
		}
	}
}

// TestMachinePatternPinned pins every return value and the final digest of
// a long machinePattern run: an optimisation of the allocator must not
// change a single decision.
//
// With the invariants tag every operation checks the whole allocator, and
// under the race detector 20,000 steps took 156 s: those builds stop at the
// checkpoint, whose hash the full run also checks on its way.
func TestMachinePatternPinned(t *testing.T) {
	const checkpoint, wantCheckpoint = 2000, "45cb5682df9e8e4599537243cde66b2ac115d84e1a3a38e83274c75496983a24"
	m := newMachinePattern(t, 1, 4000, true)
	for i := range 20000 {
		if i == checkpoint {
			if got := hex.EncodeToString(m.sum.Sum(nil)); got != wantCheckpoint {
				t.Errorf("return values hash after %d steps %s, want %s", checkpoint, got, wantCheckpoint)
			}
			if invariants.Enabled {
				t.Logf("invariants build: stopped at the %d-step checkpoint", checkpoint)
				return
			}
		}
		m.step()
		if len(m.live) > 0 && m.r.IntN(1000) == 0 {
			if err := m.a.CheckInvariants(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := m.a.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	d := m.a.Digest()
	const wantSum, wantDigest = "eae964540232b758e29b98a90448dc7ef47dd1572cab4d08ba2cf937f45ef5ba", "e18aeb3513cbfcc500f8a5241399f5fc07a326c27e789198530ea367bea368b7"
	if got := hex.EncodeToString(m.sum.Sum(nil)); got != wantSum {
		t.Errorf("return values hash %s, want %s", got, wantSum)
	}
	if got := hex.EncodeToString(d[:]); got != wantDigest {
		t.Errorf("digest %s, want %s", got, wantDigest)
	}
	if m.evictions == 0 || m.fragmented == 0 {
		t.Errorf("%d evictions, %d fragmented reservations; want both > 0", m.evictions, m.fragmented)
	}
	s := m.a.Stats()
	t.Logf("after 20000 steps: %d evictions, %d fragmented reservations; %d objects, %d free pages in %d ranges", m.evictions, m.fragmented, s.Objects, s.FreePages[0], s.FreeRanges[0])
}

// BenchmarkMachinePattern times one machinePattern step (a reservation and
// what comes with it) on a warm allocator: on the host/decisions L2 of 4000
// pages (about 250 objects, 20 free ranges) and on one a hundred times
// larger, whose objects and free list no longer fit in the caches.
func BenchmarkMachinePattern(b *testing.B) {
	for _, pages := range []int64{4000, 400000} {
		b.Run(fmt.Sprintf("l2=%d", pages), func(b *testing.B) {
			m := newMachinePattern(b, 1, pages, false)
			for range pages / 2 {
				m.step()
			}
			b.ReportAllocs()
			for b.Loop() {
				m.step()
			}
		})
	}
}

// Package policytest is the conformance suite every Evictor v1 runs
// unchanged, built-in or third party: it drives the policy with seeded random
// but legal event streams from a model radix tree (inserts, hits, splits,
// tail trims, child adds and removals, locks, evictions of the policy's own
// victims) and checks what the contract promises: a victim is always an
// evictable leaf, there is one exactly when the model has one, Victim is
// idempotent between events, two replicas fed the same events choose the
// same victims, unknown ids do not panic, and the steady state does not
// allocate per event.
//
// It also holds Simulate, a small block-level leaf-only cache simulator the
// policy packages use to compare hit rates on traces. The package must never
// depend on the radix tree or the host: it is the policy's view of the
// world, nothing more.
package policytest

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
)

// Factory builds a fresh evictor under test.
type Factory func() (policy.Evictor, error)

// Checker is implemented by evictors that can verify their own invariants;
// Check returns "" when they hold, else a description of the violation.
type Checker interface {
	Check() string
}

// Seeds is how many seeded event streams Run replays per property.
const Seeds = 40

// Run runs the whole conformance suite against evictors built by f.
func Run(t *testing.T, f Factory) {
	t.Helper()
	t.Run("Empty", func(t *testing.T) { testEmpty(t, f) })
	t.Run("NotEvictableNeverVictim", func(t *testing.T) { testNotEvictable(t, f) })
	t.Run("UnknownIDs", func(t *testing.T) { testUnknown(t, f) })
	t.Run("RandomTree", func(t *testing.T) { testRandomTree(t, f) })
	t.Run("Replicas", func(t *testing.T) { testReplicas(t, f) })
	t.Run("SteadyStateAllocs", func(t *testing.T) { testAllocs(t, f) })
}

func build(t *testing.T, f Factory) policy.Evictor {
	t.Helper()
	ev, err := f()
	if err != nil {
		t.Fatalf("build evictor: %v", err)
	}
	if ev.Name() == "" {
		t.Fatalf("evictor has an empty Name()")
	}
	return ev
}

// TailHash returns the deterministic page hash the suite and Simulate give
// the page at index page of the sequence that node id belongs to.
func TailHash(key uint64) pagehash.Hash {
	var h pagehash.Hash
	binary.LittleEndian.PutUint64(h[:8], key)
	binary.LittleEndian.PutUint64(h[8:16], ^key)
	return h
}

func testEmpty(t *testing.T, f Factory) {
	ev := build(t, f)
	if id, ok := ev.Victim(); ok {
		t.Fatalf("empty evictor returned victim %d", id)
	}
}

func testNotEvictable(t *testing.T, f Factory) {
	ev := build(t, f)
	for i := 1; i <= 10; i++ {
		ev.Insert(policy.NodeInfo{ID: policy.NodeID(i), Time: uint64(i), LastAccess: uint64(i), Pages: 1, Depth: i - 1, Tail: TailHash(uint64(i))})
	}
	if id, ok := ev.Victim(); ok {
		t.Fatalf("no node is evictable, yet Victim returned %d", id)
	}
	ev.SetEvictable(7, true)
	if id, ok := ev.Victim(); !ok || id != 7 {
		t.Fatalf("only node 7 is evictable: Victim() = %d, %v", id, ok)
	}
	ev.SetEvictable(7, false)
	if id, ok := ev.Victim(); ok {
		t.Fatalf("node 7 stopped being evictable, yet Victim returned %d", id)
	}
	ev.SetEvictable(3, true)
	ev.Remove(3)
	if id, ok := ev.Victim(); ok {
		t.Fatalf("node 3 was removed, yet Victim returned %d", id)
	}
}

func testUnknown(t *testing.T, f Factory) {
	ev := build(t, f)
	ev.SetEvictable(42, true)
	ev.SetEvictable(42, false)
	ev.Remove(42)
	if obs, ok := ev.(policy.RequestObserver); ok {
		obs.Finished(policy.RequestInfo{Leaf: 42, Time: 1, OutputTokens: 7})
		obs.Finished(policy.RequestInfo{})
	}
	if id, ok := ev.Victim(); ok {
		t.Fatalf("only unknown ids were reported, yet Victim returned %d", id)
	}
}

// model is the suite's reference radix tree: what is legal to report.
type model struct {
	rng      *rand.Rand
	clock    uint64
	nextID   policy.NodeID
	nodes    map[policy.NodeID]*mnode
	order    []policy.NodeID // live ids, in creation order (deterministic picks)
	log      []string
	maxNodes int
	pages    []pagehash.Hash // reused by finished
}

type mnode struct {
	info   policy.NodeInfo
	locked bool
	evict  bool // reported evictable
}

func newModel(seed uint64, maxNodes int) *model {
	return &model{
		rng:      rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		nextID:   1,
		nodes:    make(map[policy.NodeID]*mnode),
		maxNodes: maxNodes,
	}
}

func (m *model) isLeaf(n *mnode) bool { return n.info.Children == 0 }

// sync reports n's evictability to ev when it changed.
func (m *model) sync(ev policy.Evictor, n *mnode) {
	want := m.isLeaf(n) && !n.locked
	if want != n.evict {
		n.evict = want
		ev.SetEvictable(n.info.ID, want)
		m.logf("evictable %d %v", n.info.ID, want)
	}
}

func (m *model) logf(format string, args ...any) {
	m.log = append(m.log, fmt.Sprintf(format, args...))
	if len(m.log) > 12 {
		m.log = m.log[1:]
	}
}

func (m *model) pick() *mnode {
	if len(m.order) == 0 {
		return nil
	}
	return m.nodes[m.order[m.rng.IntN(len(m.order))]]
}

func (m *model) evictableSet() []policy.NodeID {
	var out []policy.NodeID
	for _, id := range m.order {
		if n := m.nodes[id]; n.evict {
			out = append(out, id)
		}
	}
	return out
}

func (m *model) insert(ev policy.Evictor, parent *mnode) *mnode {
	m.clock++
	id := m.nextID
	m.nextID++
	info := policy.NodeInfo{ID: id, Time: m.clock, LastAccess: m.clock, Pages: 1 + m.rng.IntN(8)}
	if parent != nil {
		info.Parent = parent.info.ID
		info.Depth = parent.info.Depth + parent.info.Pages
		parent.info.Children++
		parent.info.Time = m.clock
		ev.Update(parent.info)
		m.logf("update %d children=%d", parent.info.ID, parent.info.Children)
		m.sync(ev, parent)
	}
	info.Tail = TailHash(uint64(id)<<20 | uint64(info.Depth+info.Pages))
	n := &mnode{info: info}
	m.nodes[id] = n
	m.order = append(m.order, id)
	ev.Insert(info)
	m.logf("insert %d parent=%d", id, info.Parent)
	m.sync(ev, n)
	return n
}

func (m *model) remove(ev policy.Evictor, n *mnode) {
	delete(m.nodes, n.info.ID)
	m.order = slices.DeleteFunc(m.order, func(id policy.NodeID) bool { return id == n.info.ID })
	ev.Remove(n.info.ID)
	m.logf("remove %d", n.info.ID)
	if p, ok := m.nodes[n.info.Parent]; ok {
		m.clock++
		p.info.Children--
		p.info.Time = m.clock
		ev.Update(p.info)
		m.logf("update %d children=%d", p.info.ID, p.info.Children)
		m.sync(ev, p)
	}
}

// finished reports the request that created n as finished, the way a
// host does after its insert; now and then it names no node, another live
// node, or an output of zero tokens.
func (m *model) finished(obs policy.RequestObserver, n *mnode) {
	r := policy.RequestInfo{Leaf: n.info.ID, Time: m.clock, InputTokens: 512 * (n.info.Depth + n.info.Pages), OutputTokens: m.rng.IntN(4096), MatchedPages: n.info.Depth}
	switch m.rng.IntN(8) {
	case 0:
		r.Leaf = 0
	case 1:
		if p := m.pick(); p != nil {
			r.Leaf = p.info.ID
		}
	case 2:
		r.OutputTokens = 0
	case 3, 4:
		// The prompt's pages, named the way the model names tails, of
		// this node or of another one (whose trimmed pages a policy may
		// remember), with a random matched prefix.
		src := n
		if p := m.pick(); p != nil && m.rng.IntN(2) == 0 {
			src = p
		}
		m.pages = m.pages[:0]
		for k := 1; k <= src.info.Depth+src.info.Pages+m.rng.IntN(3); k++ {
			m.pages = append(m.pages, TailHash(uint64(src.info.ID)<<20|uint64(k)))
		}
		r.Pages, r.MatchedPages = m.pages, m.rng.IntN(len(m.pages)+1)
	}
	obs.Finished(r)
	m.logf("finished leaf=%d output=%d", r.Leaf, r.OutputTokens)
}

// step applies one random legal event and returns false when the tree
// became empty and nothing happened.
func (m *model) step(ev policy.Evictor) {
	r := m.rng.IntN(100)
	switch {
	case r < 30 && len(m.nodes) < m.maxNodes: // insert under a random node or the root
		var parent *mnode
		if m.rng.IntN(4) != 0 {
			parent = m.pick()
		}
		n := m.insert(ev, parent)
		if obs, ok := ev.(policy.RequestObserver); ok {
			m.finished(obs, n)
		}
	case r < 50: // hit a random node and its ancestors
		n := m.pick()
		if n == nil {
			return
		}
		m.clock++
		for n != nil {
			n.info.Hits++
			n.info.Time, n.info.LastAccess = m.clock, m.clock
			ev.Hit(n.info)
			m.logf("hit %d", n.info.ID)
			n = m.nodes[n.info.Parent]
		}
	case r < 60: // lock or unlock
		n := m.pick()
		if n == nil {
			return
		}
		n.locked = !n.locked
		m.sync(ev, n)
	case r < 70: // split: a new node takes the first pages of n
		n := m.pick()
		if n == nil || n.info.Pages < 2 {
			return
		}
		m.clock++
		k := 1 + m.rng.IntN(n.info.Pages-1)
		id := m.nextID
		m.nextID++
		top := &mnode{info: n.info}
		top.info.ID, top.info.Pages, top.info.Children = id, k, 1
		top.info.Time = m.clock
		top.info.Tail = TailHash(uint64(id)<<20 | uint64(n.info.Depth+k))
		m.nodes[id] = top
		m.order = append(m.order, id)
		ev.Insert(top.info)
		m.logf("split %d -> %d", n.info.ID, id)
		n.info.Parent, n.info.Depth, n.info.Pages = id, n.info.Depth+k, n.info.Pages-k
		n.info.Time = m.clock
		ev.Update(n.info)
		m.sync(ev, top)
	default: // evict (or trim) the policy's victim
		v, ok := ev.Victim()
		want := m.evictableSet()
		if ok != (len(want) > 0) {
			panic(fmt.Sprintf("Victim() ok=%v but the model has %d evictable leaves %v", ok, len(want), want))
		}
		if !ok {
			return
		}
		n, live := m.nodes[v]
		if !live || !n.evict {
			panic(fmt.Sprintf("Victim() = %d, which is not an evictable leaf (evictable: %v)", v, want))
		}
		if v2, _ := ev.Victim(); v2 != v {
			panic(fmt.Sprintf("Victim() is not idempotent: %d then %d with no event between", v, v2))
		}
		if n.info.Pages > 1 && m.rng.IntN(3) == 0 {
			m.clock++
			n.info.Pages--
			n.info.Time = m.clock
			n.info.Tail = TailHash(uint64(n.info.ID)<<20 | uint64(n.info.Depth+n.info.Pages))
			ev.Update(n.info)
			m.logf("trim %d", v)
			return
		}
		m.remove(ev, n)
	}
}

func check(ev policy.Evictor) string {
	if c, ok := ev.(Checker); ok {
		return c.Check()
	}
	return ""
}

// drive runs steps events on a model seeded by seed and returns the victims
// it saw, failing t on a contract violation.
func drive(t *testing.T, ev policy.Evictor, seed uint64, steps, maxNodes int) []policy.NodeID {
	t.Helper()
	m := newModel(seed, maxNodes)
	var victims []policy.NodeID
	for i := 0; i < steps; i++ {
		var failure any
		func() {
			defer func() { failure = recover() }()
			m.step(ev)
		}()
		if failure != nil {
			t.Fatalf("seed %d step %d: %v\nlast events: %v", seed, i, failure, m.log)
		}
		if msg := check(ev); msg != "" {
			t.Fatalf("seed %d step %d: invariant: %s\nlast events: %v", seed, i, msg, m.log)
		}
		if v, ok := ev.Victim(); ok {
			victims = append(victims, v)
		}
	}
	return victims
}

func testRandomTree(t *testing.T, f Factory) {
	for seed := uint64(1); seed <= Seeds; seed++ {
		drive(t, build(t, f), seed, 600, 40+int(seed)*5)
	}
}

func testReplicas(t *testing.T, f Factory) {
	for seed := uint64(100); seed < 100+Seeds/4; seed++ {
		a := drive(t, build(t, f), seed, 800, 80)
		b := drive(t, build(t, f), seed, 800, 80)
		if !slices.Equal(a, b) {
			i := 0
			for i < len(a) && i < len(b) && a[i] == b[i] {
				i++
			}
			t.Fatalf("seed %d: two replicas fed the same events diverge at victim %d", seed, i)
		}
	}
}

// testAllocs churns a tree of a fixed size: insert a leaf, hit it, evict
// the victim. After warm-up this must not allocate.
func testAllocs(t *testing.T, f Factory) {
	ev := build(t, f)
	const live = 512
	var clock uint64
	next := policy.NodeID(1)
	add := func() {
		clock++
		id := next
		next++
		info := policy.NodeInfo{ID: id, Time: clock, LastAccess: clock, Pages: 4, Depth: int(id % 16), Tail: TailHash(uint64(id))}
		ev.Insert(info)
		ev.SetEvictable(id, true)
		if id%3 == 0 {
			clock++
			info.Hits, info.Time, info.LastAccess = 1, clock, clock
			ev.Hit(info)
		}
	}
	for i := 0; i < live; i++ {
		add()
	}
	cycle := func() {
		v, ok := ev.Victim()
		if !ok {
			panic("no victim in a full cache")
		}
		ev.Remove(v)
		add()
	}
	for i := 0; i < 20*live; i++ {
		cycle()
	}
	allocs := testing.AllocsPerRun(4*live, cycle)
	// A cycle is 4-5 events; a Go map may still rehash now and then.
	if allocs > 0.05 {
		t.Fatalf("steady state allocates %.3f times per insert/hit/evict cycle, want ~0", allocs)
	}
}

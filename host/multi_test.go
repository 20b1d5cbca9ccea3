package host_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/host"
	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/host/stack"
	"github.com/kvtier/kvtier/pagehash"
)

// multiDriver runs one Machine for several local ranks (host.Multi), a
// simulated engine on each, as a node hosting an engine's ranks would.
type multiDriver struct {
	t    *testing.T
	ctx  context.Context
	mu   *host.Multi
	m    *control.Machine
	engs []*host.SimEngine
}

func newMultiDriver(t *testing.T, stacks []*stack.Stack, lanes int, opts host.Options) *multiDriver {
	t.Helper()
	base := control.DefaultOptions()
	base.DigestEvery = 0
	base.Logger = slog.New(slog.DiscardHandler)
	mo, err := host.MachineOptions(stacks[0], base, opts.Store)
	if err != nil {
		t.Fatal(err)
	}
	m, err := control.New(mo)
	if err != nil {
		t.Fatal(err)
	}
	d := &multiDriver{t: t, ctx: context.Background(), m: m}
	var locals []host.Local
	for i, s := range stacks {
		eng, err := host.NewSimEngine(s.Pool, s.Config.Payload)
		if err != nil {
			t.Fatal(err)
		}
		lane := 0
		if lanes > 1 {
			lane = i
		}
		if err := eng.OwnLane(lane, max(lanes, 1)); err != nil {
			t.Fatal(err)
		}
		d.engs = append(d.engs, eng)
		locals = append(locals, host.Local{Stack: s, Rank: lane, Engine: eng})
	}
	opts.Lanes = lanes
	if d.mu, err = host.NewMulti(m, locals, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.mu.Close(); err != nil {
			t.Error(err)
		}
	})
	return d
}

func (d *multiDriver) apply(e control.Event) control.Ready {
	d.t.Helper()
	return mustApply(d.t, d.ctx, d.mu, e)
}

func (d *multiDriver) tick() control.Ready { d.t.Helper(); return mustTick(d.t, d.ctx, d.mu) }

// request runs one request as driver.request does and returns the pages
// every rank read from its L1 with the right bytes (the least of the
// ranks' counts).
func (d *multiDriver) request(req control.ReqID, k []pagehash.Hash) int {
	d.t.Helper()
	return runRequest(d.t, d.apply, d.tick, func(refs []control.PageRef) int {
		good := len(refs)
		for i, e := range d.engs {
			g, err := e.Verify(refs)
			if err != nil {
				d.t.Fatalf("rank %d: %v", i, err)
			}
			good = min(good, g)
		}
		return good
	}, d.m, req, k)
}

func openStacks(t *testing.T, n int, entry func(dir string) string) []*stack.Stack {
	t.Helper()
	var ss []*stack.Stack
	for i := range n {
		dir := filepath.Join(t.TempDir(), fmt.Sprintf("rank%d", i))
		ss = append(ss, openStack(t, stackYAML(dir, entry(dir)), dir))
	}
	return ss
}

// TestMultiRealTiers runs TestNodeRealTiers's conversations through one
// Machine for several local ranks, each over its own real tiers: every
// path moves bytes on every rank, every rank reads its pages back with
// the right bytes after a reload, and with owner lanes no rank's store
// holds a page of another lane.
func TestMultiRealTiers(t *testing.T) {
	for _, c := range []struct {
		name         string
		ranks, lanes int
		entry        func(dir string) string
	}{
		{"2 lanes memstore", 2, 2, func(string) string { return memstoreEntry }},
		{"3 lanes l3disk-lmdb", 3, 3, l3diskEntry},
		{"2 replicas memstore", 2, 1, func(string) string { return memstoreEntry }},
	} {
		t.Run(c.name, func(t *testing.T) {
			stacks := openStacks(t, c.ranks, c.entry)
			d := newMultiDriver(t, stacks, c.lanes, host.Options{})
			for i := range 20 {
				if got := d.request(control.ReqID(i+1), key(i, 4)); got != 0 {
					t.Fatalf("conversation %d: %d hits on first sight", i, got)
				}
			}
			if got := d.request(100, key(19, 4)); got != 4 {
				t.Fatalf("recent conversation: %d L1 hits, want 4", got)
			}
			if got := d.request(101, key(0, 4)); got != 4 {
				t.Fatalf("old conversation: %d hits after reload, want 4 (stats %+v)", got, d.mu.Stats())
			}
			for i, e := range d.engs {
				if e.WrongBytes != 0 || e.VerifiedPages == 0 {
					t.Fatalf("rank %d: %d wrong bytes, %d verified pages", i, e.WrongBytes, e.VerifiedPages)
				}
				st := d.mu.Rank(i).Stats()
				if st.L1ToL2 == 0 || st.L2ToL3 == 0 || st.L3ToL2 == 0 || st.L2ToL1 == 0 {
					t.Fatalf("rank %d: a path moved nothing: %+v", i, st)
				}
			}
			st := d.mu.Stats()
			if st.Ticks == 0 || st.L2ToL3 != sumRanks(d.mu, func(s host.Stats) int64 { return s.L2ToL3 }) {
				t.Fatalf("stats %+v do not sum the ranks'", st)
			}
			// Each rank's store: its own lane's pages of conversation 19,
			// none of another's.
			k := key(19, 4)
			for i, s := range stacks {
				for j, h := range k {
					got, err := s.Stores[0].Store.LongestPrefix(d.ctx, 0, []pagehash.Hash{h})
					if err != nil {
						t.Fatal(err)
					}
					own := c.lanes <= 1 || control.OwnerOf(j, c.lanes) == i
					if own != (got == 1) {
						t.Fatalf("rank %d page %d: in its store %v, owned %v", i, j, got == 1, own)
					}
				}
			}
			if err := d.m.CheckInvariants(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func sumRanks(mu *host.Multi, f func(host.Stats) int64) int64 {
	var t int64
	for i := range mu.Ranks() {
		t += f(mu.Rank(i).Stats())
	}
	return t
}

// TestMultiDecidesAsANode is metamorphic: the same workload through a
// Node of one rank, a Multi of one rank, a Multi of three replicas and a
// Multi of three owner lanes leaves the same replicated state (the
// Machine's digest after every request): what every rank finishes is
// reduced before the Machine sees it, so more local ranks never change a
// decision while they all succeed.
func TestMultiDecidesAsANode(t *testing.T) {
	const requests = 30
	keyOf := func(i int) []pagehash.Hash { return key(i%12, 2+i%5) }
	node := newDriver(t, openStacks(t, 1, func(string) string { return memstoreEntry })[0], host.Options{})
	var want [][32]byte
	for i := range requests {
		node.request(control.ReqID(i+1), keyOf(i))
		want = append(want, node.n.Machine().Digest())
	}
	for _, c := range []struct{ ranks, lanes int }{{1, 1}, {3, 1}, {3, 3}} {
		d := newMultiDriver(t, openStacks(t, c.ranks, func(string) string { return memstoreEntry }), c.lanes, host.Options{})
		for i := range requests {
			d.request(control.ReqID(i+1), keyOf(i))
			if got := d.m.Digest(); got != want[i] {
				t.Fatalf("%d ranks, %d lanes: after request %d the digest differs from the Node's", c.ranks, c.lanes, i+1)
			}
		}
		for i, e := range d.engs {
			if e.WrongBytes != 0 {
				t.Fatalf("%d ranks, %d lanes: rank %d read %d wrong bytes", c.ranks, c.lanes, i, e.WrongBytes)
			}
		}
	}
}

// TestMultiOneRankFails: a store failing on one local rank fails the
// node's spills (the Machine rolls them back; an op is ok only where
// every rank finished it), so the old conversation is recomputed, never
// read half from one rank's store.
func TestMultiOneRankFails(t *testing.T) {
	stacks := openStacks(t, 2, func(string) string { return memstoreEntry })
	stacks[1].Stores[0].Store = brokenStore{stacks[1].Stores[0].Store}
	d := newMultiDriver(t, stacks, 2, host.Options{})
	for i := range 20 {
		d.request(control.ReqID(i+1), key(i, 4))
	}
	if got := d.request(101, key(0, 4)); got != 0 {
		t.Fatalf("old conversation with one rank's store broken: %d hits, want 0", got)
	}
	if st := d.mu.Rank(1).Stats(); st.FailedOps["put"] == 0 {
		t.Fatalf("rank 1 failed no put: %+v", st)
	}
	if st := d.mu.Stats(); st.Skips["failed"] == 0 && st.FailedOps["put"] == 0 {
		t.Fatalf("stats %+v", st)
	}
	for i, e := range d.engs {
		if e.WrongBytes != 0 {
			t.Fatalf("rank %d: %d wrong bytes", i, e.WrongBytes)
		}
	}
}

// TestNewMultiRefuses: no ranks, a rank of another geometry, and events
// or ticks on a rank's own Node are refused, naming what.
func TestNewMultiRefuses(t *testing.T) {
	stacks := openStacks(t, 2, func(string) string { return memstoreEntry })
	m, err := control.New(mustOptions(t, stacks[0]))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := host.NewMulti(m, nil, host.Options{}); err == nil || !strings.Contains(err.Error(), "local ranks") {
		t.Fatalf("no ranks: %v", err)
	}
	dir := t.TempDir()
	other := openStack(t, strings.Replace(stackYAML(dir, memstoreEntry), "pages: 8,", "pages: 16,", 1), dir)
	_, err = host.NewMulti(m, []host.Local{{Stack: stacks[0]}, {Stack: other}}, host.Options{})
	if err == nil || !strings.Contains(err.Error(), "local rank 1") || !strings.Contains(err.Error(), "L1 of 16 pages") {
		t.Fatalf("a rank of another geometry: %v", err)
	}
	mu, err := host.NewMulti(m, []host.Local{{Stack: stacks[0]}, {Stack: stacks[1]}}, host.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mu.Close()
	if _, err := mu.Rank(1).Apply(context.Background(), control.Event{Kind: control.EvRelease, Req: 1}); err == nil || !strings.Contains(err.Error(), "through the Multi") {
		t.Fatalf("an event on a rank's Node: %v", err)
	}
	if _, err := mu.Rank(0).Tick(context.Background()); err == nil {
		t.Fatal("a tick on a rank's Node was taken")
	}
}

func mustOptions(t *testing.T, s *stack.Stack) control.Options {
	t.Helper()
	base := control.DefaultOptions()
	base.Logger = slog.New(slog.DiscardHandler)
	mo, err := host.MachineOptions(s, base, "")
	if err != nil {
		t.Fatal(err)
	}
	return mo
}

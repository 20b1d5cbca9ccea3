package host_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kvtier/kvtier/host"
	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/host/stack"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// stackYAML is a small stack: a host L1 pool of 8 pages, a 1 MiB shm slab
// (64 pages of 16 KiB) and the given store entry, under dir.
func stackYAML(dir, store string) string {
	return fmt.Sprintf(`version: 1
model:
  page_tokens: 16
  payloads:
    - {name: kv, page_bytes: 16KiB}
tiers:
  - name: l1
    role: pool
    use: host
    config: {pages: 8, layers: 4, workers: 1}
  - name: l2
    role: slab
    use: l2hugetlb
    config: {size: 1MiB, fallback: shm, mount: %[1]s/no-hugetlbfs, shm_dir: %[1]s/shm, name: nodetest}
%[2]s`, dir, store)
}

const memstoreEntry = `  - name: mem
    role: store
    use: memstore
    config: {capacity: 64MiB}
`

func l3diskEntry(dir string) string {
	return fmt.Sprintf(`  - name: l3
    role: store
    use: l3disk
    index: {use: lmdb, config: {dir: %[1]s/index}}
    config:
      disks: [{dir: %[1]s/l3, budget: 64MiB}]
`, dir)
}

func openStack(t *testing.T, yaml, dir string) *stack.Stack {
	t.Helper()
	for _, d := range []string{"shm", "l3", "index"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := builtin.Tiers()
	if err != nil {
		t.Fatal(err)
	}
	ix, err := builtin.Indexes()
	if err != nil {
		t.Fatal(err)
	}
	pr, err := builtin.Policies()
	if err != nil {
		t.Fatal(err)
	}
	st, err := config.Load([]byte(yaml), "node.yaml", config.Modules{Tiers: tr, Indexes: ix, Policies: pr})
	if err != nil {
		t.Fatal(err)
	}
	s, err := stack.Open(context.Background(), st, stack.Registries{Tiers: tr, Indexes: ix}, stack.Options{StackID: "nodetest", ColdStart: tiers.ColdStartClear})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// key returns n page hashes of conversation c.
func key(c, n int) []pagehash.Hash {
	hs := make([]pagehash.Hash, n)
	for i := range hs {
		binary.LittleEndian.PutUint64(hs[i][0:8], uint64(c)<<20|uint64(i))
		hs[i][31] = 0x5a
	}
	return hs
}

type driver struct {
	t   *testing.T
	ctx context.Context
	n   *host.Node
	eng *host.SimEngine
}

func newDriver(t *testing.T, s *stack.Stack, opts host.Options) *driver {
	t.Helper()
	base := control.DefaultOptions()
	base.DigestEvery = 0
	base.Logger = slog.New(slog.DiscardHandler)
	mo, err := host.MachineOptions(s, base, opts.Store)
	if err != nil {
		t.Fatal(err)
	}
	m, err := control.New(mo)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := host.NewSimEngine(s.Pool, s.Config.Payload)
	if err != nil {
		t.Fatal(err)
	}
	opts.Engine = eng
	n, err := host.New(s, m, opts)
	if err != nil {
		t.Fatal(err)
	}
	return &driver{t: t, ctx: context.Background(), n: n, eng: eng}
}

// drivable is a host.Node or a host.Multi.
type drivable interface {
	Apply(ctx context.Context, e control.Event) (control.Ready, error)
	Settle(ctx context.Context) error
	Tick(ctx context.Context) (control.Ready, error)
}

func mustApply(t *testing.T, ctx context.Context, x drivable, e control.Event) control.Ready {
	t.Helper()
	rd, err := x.Apply(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	return rd
}

// mustTick settles (every answer in before the frontier) and ticks.
func mustTick(t *testing.T, ctx context.Context, x drivable) control.Ready {
	t.Helper()
	if err := x.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	rd, err := x.Tick(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return rd
}

func (d *driver) apply(e control.Event) control.Ready {
	d.t.Helper()
	return mustApply(d.t, d.ctx, d.n, e)
}
func (d *driver) tick() control.Ready { d.t.Helper(); return mustTick(d.t, d.ctx, d.n) }

// request runs one request and returns the pages it read from L1 with the
// right bytes.
func (d *driver) request(req control.ReqID, k []pagehash.Hash) int {
	d.t.Helper()
	return runRequest(d.t, d.apply, d.tick, func(refs []control.PageRef) int {
		good, err := d.eng.Verify(refs)
		if err != nil {
			d.t.Fatal(err)
		}
		return good
	}, d.n.Machine(), req, k)
}

// runRequest runs one request through apply and tick: match (waiting out
// a reload hold, re-matching once when it landed), tick, verify the L1
// prefix, insert, tick, finish, release, tick. It returns what verify
// returned.
func runRequest(t *testing.T, apply func(control.Event) control.Ready, tick func() control.Ready, verify func([]control.PageRef) int,
	m *control.Machine, req control.ReqID, k []pagehash.Hash) int {
	t.Helper()
	rd := apply(control.Event{Kind: control.EvMatch, Req: req, Pages: len(k), Hashes: k})
	if res := rd.Matches[len(rd.Matches)-1]; res.Held {
		var reason control.HoldReason
		for i := 0; reason == 0 && i < 100; i++ {
			for _, u := range tick().Unholds {
				if u.Req == req {
					reason = u.Reason
				}
			}
		}
		if reason == 0 {
			t.Fatalf("request %d held for 100 ticks", req)
		}
		if reason == control.Loaded {
			apply(control.Event{Kind: control.EvMatch, Req: req, Pages: len(k), Hashes: k})
		}
	}
	tick()
	good := verify(m.MatchedL1(req, nil))
	apply(control.Event{Kind: control.EvInsert, Req: req, Pages: len(k), Hashes: k})
	tick()
	apply(control.Event{Kind: control.EvFinish, Req: req})
	apply(control.Event{Kind: control.EvRelease, Req: req})
	tick()
	return good
}

// TestNodeRealTiers runs a Node over a host pool, an shm slab and a real
// store (memstore; l3disk with LMDB): twenty 4-page conversations push the
// first out of L1 and L2, so asking for it again reloads it from the store
// into L2 and loads it back into L1, where the engine reads it with the
// right bytes. Every path moved bytes.
func TestNodeRealTiers(t *testing.T) {
	for _, c := range []struct {
		name  string
		entry func(dir string) string
	}{
		{"memstore", func(string) string { return memstoreEntry }},
		{"l3disk-lmdb", l3diskEntry},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openStack(t, stackYAML(dir, c.entry(dir)), dir)
			d := newDriver(t, s, host.Options{})
			for i := range 20 {
				if got := d.request(control.ReqID(i+1), key(i, 4)); got != 0 {
					t.Fatalf("conversation %d: %d hits on first sight", i, got)
				}
			}
			// The second turn of conversation 19 hits L1.
			if got := d.request(100, key(19, 4)); got != 4 {
				t.Fatalf("recent conversation: %d L1 hits, want 4", got)
			}
			// Conversation 0 left L1 and L2 long ago: it comes back from the
			// store.
			if got := d.request(101, key(0, 4)); got != 4 {
				t.Fatalf("old conversation: %d hits after reload, want 4 (stats %+v)", got, d.n.Stats())
			}
			st := d.n.Stats()
			t.Logf("stats %+v, verified %d", st, d.eng.VerifiedPages)
			if d.eng.WrongBytes != 0 {
				t.Fatalf("%d wrong bytes", d.eng.WrongBytes)
			}
			if st.L1ToL2 == 0 || st.L2ToL3 == 0 || st.L3ToL2 == 0 || st.L2ToL1 == 0 {
				t.Fatalf("a path moved nothing: %+v", st)
			}
			if err := d.n.Machine().CheckInvariants(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// brokenStore fails every Put and Get and answers lookups with an error.
type brokenStore struct{ tiers.Store }

var errBroken = errors.New("injected store failure")

func (brokenStore) Put(context.Context, []tiers.PutRequest) (tiers.BatchID, error) {
	return 0, errBroken
}
func (brokenStore) Get(context.Context, []tiers.GetRequest, []error) error { return errBroken }
func (brokenStore) LongestPrefix(context.Context, tiers.PayloadKind, []pagehash.Hash) (int, error) {
	return 0, errBroken
}

// TestNodeStoreErrorsAreMisses: a store that fails everything costs
// misses (failed spills, lookups answered 0) and recomputes, never a
// hang or a wrong byte.
func TestNodeStoreErrorsAreMisses(t *testing.T) {
	dir := t.TempDir()
	s := openStack(t, stackYAML(dir, memstoreEntry), dir)
	s.Stores[0].Store = brokenStore{s.Stores[0].Store}
	d := newDriver(t, s, host.Options{})
	for i := range 20 {
		d.request(control.ReqID(i+1), key(i, 4))
	}
	if got := d.request(101, key(0, 4)); got != 0 {
		t.Fatalf("old conversation over a broken store: %d hits, want 0", got)
	}
	st := d.n.Stats()
	t.Logf("stats %+v", st)
	if st.FailedOps["put"] == 0 || st.FailedOps["lookup"] == 0 || d.eng.WrongBytes != 0 {
		t.Fatalf("stats %+v, wrong bytes %d", st, d.eng.WrongBytes)
	}
}

// silentPool accepts copies and never acknowledges them.
type silentPool struct {
	tiers.Pool
	next tiers.BatchID
}

func (p *silentPool) CopyToSlab(context.Context, []tiers.PoolCopy) (tiers.BatchID, error) {
	p.next++
	return p.next, nil
}

// TestNodeSilentPoolTimesOut: a pool that never acknowledges a backup is
// a failed op after SettleTimeout (the backup rolls back), not a hang.
func TestNodeSilentPoolTimesOut(t *testing.T) {
	dir := t.TempDir()
	s := openStack(t, stackYAML(dir, memstoreEntry), dir)
	// The simulated engine writes through the real pool; the Node copies
	// through the silent one.
	d := newDriver(t, s, host.Options{SettleTimeout: 50 * time.Millisecond})
	real := s.Pool
	s.Pool = &silentPool{Pool: real}
	t.Cleanup(func() { s.Pool = real })
	start := time.Now()
	d.request(1, key(1, 4))
	st := d.n.Stats()
	if st.FailedOps["timeout"] == 0 || st.Skips["failed"] == 0 {
		t.Fatalf("stats %+v: the silent backup did not fail", st)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("took %v", el)
	}
}

func TestSoloRefusesAnotherTick(t *testing.T) {
	m, err := control.New(control.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	c := m.Contribution()
	if _, err := (host.Solo{}).Exchange(context.Background(), 1, c); !errors.Is(err, control.ErrFrontier) {
		t.Fatalf("exchange for tick 1 at tick 0: %v", err)
	}
	f, err := (host.Solo{}).Exchange(context.Background(), 0, c)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Tick(f); err != nil {
		t.Fatal(err)
	}
}

func TestNewRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	s := openStack(t, stackYAML(dir, memstoreEntry), dir)
	m, err := control.New(control.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := host.New(nil, m, host.Options{}); err == nil {
		t.Error("nil stack accepted")
	}
	if _, err := host.New(s, m, host.Options{Store: "nope"}); err == nil {
		t.Error("unknown store accepted")
	}
	if _, err := host.MachineOptions(s, control.DefaultOptions(), "nope"); err == nil {
		t.Error("unknown store accepted by MachineOptions")
	}
}

// input is one request to a Node owned by runNode's goroutine: apply an
// engine event, then optionally settle (wait for the tiers' acks) and
// tick.
type input struct {
	event        *control.Event
	settle, tick bool
	// reply receives the outcome; it must have room for one value.
	reply chan<- output
}

// output is the outcome of one input: the Ready of the event and, when it
// ticked, the Ready of the tick, and the first error.
type output struct {
	event, tick control.Ready
	err         error
}

// runNode makes the calling goroutine the owner of n over stack s, as
// serve's rank loop does: it serves inputs in order and drains the tiers'
// acks and the store worker's results into the Machine as they arrive,
// until in is closed (nil) or ctx ends (ctx.Err()).
func runNode(ctx context.Context, n *host.Node, s *stack.Stack, in <-chan input) error {
	var storeAcks <-chan struct{}
	if len(s.Stores) > 0 {
		storeAcks = s.Stores[0].Store.AckReady()
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case x, ok := <-in:
			if !ok {
				return nil
			}
			var out output
			if x.event != nil {
				out.event, out.err = n.Apply(ctx, *x.event)
			}
			if out.err == nil && x.settle {
				out.err = n.Settle(ctx)
			}
			if out.err == nil && x.tick {
				out.tick, out.err = n.Tick(ctx)
			}
			select {
			case x.reply <- out:
			case <-ctx.Done():
				return ctx.Err()
			}
		case <-s.Pool.AckReady():
			n.Drain()
		case <-storeAcks:
			n.Drain()
		case <-n.StoreReady():
			n.Drain()
		}
	}
}

// TestNodeRun drives a Node owned by its own goroutine (runNode) through
// a channel: the same requests give the same hits and bytes as the
// synchronous driver.
func TestNodeRun(t *testing.T) {
	dir := t.TempDir()
	s := openStack(t, stackYAML(dir, memstoreEntry), dir)
	d := newDriver(t, s, host.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	in := make(chan input)
	done := make(chan error, 1)
	go func() { done <- runNode(ctx, d.n, s, in) }()
	call := func(x input) output {
		reply := make(chan output, 1)
		x.reply = reply
		in <- x
		out := <-reply
		if out.err != nil {
			t.Fatal(out.err)
		}
		return out
	}
	hits := 0
	for i := range 12 {
		k := key(i%6, 4)
		req := control.ReqID(i + 1)
		out := call(input{event: &control.Event{Kind: control.EvMatch, Req: req, Pages: 4, Hashes: k}, settle: true, tick: true})
		released := func(rd control.Ready) bool {
			return slices.ContainsFunc(rd.Unholds, func(u control.Unhold) bool { return u.Req == req })
		}
		for try := 0; out.event.Matches[0].Held && !released(out.tick); try++ {
			if try == 100 {
				t.Fatalf("request %d held for 100 ticks", req)
			}
			if released(call(input{settle: true, tick: true}).tick) {
				break
			}
		}
		call(input{event: &control.Event{Kind: control.EvInsert, Req: req, Pages: 4, Hashes: k}, settle: true, tick: true})
		call(input{event: &control.Event{Kind: control.EvFinish, Req: req}})
		call(input{event: &control.Event{Kind: control.EvRelease, Req: req}, settle: true, tick: true})
		hits += out.event.Matches[0].L1 + out.event.Matches[0].L2
	}
	close(in)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	cancel()
	if hits == 0 || d.n.Stats().L1ToL2 == 0 {
		t.Fatalf("hits %d, stats %+v", hits, d.n.Stats())
	}
	// A cancelled context ends the owner.
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := runNode(ctx2, d.n, s, make(chan input)); !errors.Is(err, context.Canceled) {
		t.Fatalf("run after cancel: %v", err)
	}
}

// waitFor polls cond (a count, never a time) for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// held reports whether req is held by the Machine.
func held(n *host.Node, req control.ReqID) bool { return slices.Contains(n.Machine().Held(), req) }

// TestNodeAsyncStore: a store whose every call waits at a gate (a fault
// injection fake) never stalls the Node's driver. A request that needs a
// reload stays held while its lookup waits, tick after tick; opening the
// gate answers it, and the reload lands with the right bytes. A lookup
// abandoned by Settle's timeout is a miss, and its late answer is ignored.
func TestNodeAsyncStore(t *testing.T) {
	dir := t.TempDir()
	s := openStack(t, stackYAML(dir, memstoreEntry), dir)
	g := tiertest.NewGatedStore(s.Stores[0].Store)
	s.Stores[0].Store = g
	d := newDriver(t, s, host.Options{})
	for i := range 20 {
		d.request(control.ReqID(i+1), key(i, 4))
	}

	g.Block()
	k := key(0, 4)
	rd := d.apply(control.Event{Kind: control.EvMatch, Req: 101, Pages: len(k), Hashes: k})
	if m := rd.Matches[len(rd.Matches)-1]; !m.Held || len(rd.Lookups) == 0 {
		t.Fatalf("conversation 0 is not held for a lookup: %+v, lookups %d", m, len(rd.Lookups))
	}
	waitFor(t, "the lookup at the gate", func() bool { return g.Waiting() >= 1 })
	for i := range 5 {
		// Tick without Settle: what a serve step does.
		rd, err := d.n.Tick(d.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(rd.Unholds) > 0 || !held(d.n, 101) || d.n.Outstanding() == 0 {
			t.Fatalf("tick %d with the store blocked: unholds %v, held %v, outstanding %d", i, rd.Unholds, held(d.n, 101), d.n.Outstanding())
		}
	}
	g.Release()
	var reason control.HoldReason
	for i := 0; reason == 0 && i < 100; i++ {
		for _, u := range d.tick().Unholds {
			if u.Req == 101 {
				reason = u.Reason
			}
		}
	}
	if reason != control.Loaded {
		t.Fatalf("after the gate opened: unhold %v, want loaded (stats %+v)", reason, d.n.Stats())
	}
	d.apply(control.Event{Kind: control.EvMatch, Req: 101, Pages: len(k), Hashes: k})
	d.tick()
	good, err := d.eng.Verify(d.n.Machine().MatchedL1(101, nil))
	if err != nil {
		t.Fatal(err)
	}
	if good != 4 || d.eng.WrongBytes != 0 || d.n.Stats().L3ToL2 == 0 {
		t.Fatalf("reloaded %d good pages, %d wrong bytes, stats %+v", good, d.eng.WrongBytes, d.n.Stats())
	}
	d.apply(control.Event{Kind: control.EvFinish, Req: 101})
	d.apply(control.Event{Kind: control.EvRelease, Req: 101})
	d.tick()

	// Abandoned: Settle gives up on a lookup at the closed gate (a new
	// Node over its own stack: a miss is looked up in the store too).
	dir2 := t.TempDir()
	s2 := openStack(t, stackYAML(dir2, memstoreEntry), dir2)
	g2 := tiertest.NewGatedStore(s2.Stores[0].Store)
	s2.Stores[0].Store = g2
	short := newDriver(t, s2, host.Options{SettleTimeout: 20 * time.Millisecond})
	g2.Block()
	k = key(1, 4)
	short.apply(control.Event{Kind: control.EvMatch, Req: 301, Pages: len(k), Hashes: k})
	before := short.n.Stats().FailedOps["timeout"]
	if err := short.n.Settle(short.ctx); err != nil {
		t.Fatal(err)
	}
	if got := short.n.Stats().FailedOps["timeout"]; got != before+1 || short.n.Outstanding() != 0 {
		t.Fatalf("settle over a blocked lookup: %d timeouts (was %d), %d outstanding", got, before, short.n.Outstanding())
	}
	g2.Release()
	waitFor(t, "the abandoned lookup to return", func() bool { return g2.Waiting() == 0 })
	reason = 0
	for i := 0; reason == 0 && i < 10; i++ {
		for _, u := range short.tick().Unholds {
			if u.Req == 301 {
				reason = u.Reason
			}
		}
	}
	if reason != control.Missed {
		t.Fatalf("abandoned lookup: unhold %v, want missed", reason)
	}
	if err := short.n.Machine().CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	if err := short.n.Close(); err != nil {
		t.Fatal(err)
	}
}

package pluginhost

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

// The tests in this file drive plugins/internal/faultplugin, a
// FAULT-INJECTING plugin binary built only for them (a real memstore and a
// real badger index behind interceptors that crash, hang or answer garbage).

const faultPkg = "plugins/internal/faultplugin"

const slot = 12 << 10 // bytes per page slot: kind 0's page size

// harness is a store plugin with a slab and helpers to write and read pages.
type harness struct {
	t     *testing.T
	store *Store
	slab  tiers.Slab
	rng   *rand.Rand
	seed  uint64
	acks  map[tiers.BatchID][]tiers.Ack
}

func newHarness(t *testing.T, opts Options, seed uint64) *harness {
	t.Helper()
	path, sum := pluginBinary(t, faultPkg)
	slab := newSlab(t, 256*slot)
	st, err := OpenStore(context.Background(), storeEnv(t, slab, nil), PluginSpec{
		Name: "fault", Path: path, SHA256: sum, Options: opts,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d", seed)
		}
	})
	return &harness{t: t, store: st, slab: slab, rng: newRandFor(seed), seed: seed, acks: map[tiers.BatchID][]tiers.Ack{}}
}

// newRandFor returns the seeded generator of a test.
func newRandFor(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed)) }

type testPage struct {
	key  tiers.Key
	data []byte
}

func (h *harness) pages(n int) []testPage {
	out := make([]testPage, n)
	for i := range out {
		var tok [8]uint32
		for j := range tok {
			tok[j] = h.rng.Uint32()
		}
		data := make([]byte, slot)
		for j := range data {
			data[j] = byte(h.rng.Uint32())
		}
		out[i] = testPage{key: tiers.Key{Hash: pagehash.Next(pagehash.Root, tok[:]), Kind: 0}, data: data}
	}
	return out
}

func (h *harness) span(i int) tiers.Span {
	return tiers.Span{Slab: 0, Offset: int64(i) * slot, Length: slot}
}

// put writes pages into slots base.. and puts them as one batch.
func (h *harness) put(base int, ps []testPage) tiers.BatchID {
	h.t.Helper()
	reqs := make([]tiers.PutRequest, len(ps))
	for i, p := range ps {
		b, err := h.slab.Bytes(h.span(base + i))
		if err != nil {
			h.t.Fatal(err)
		}
		copy(b, p.data)
		reqs[i] = tiers.PutRequest{Key: p.key, Src: h.span(base + i)}
	}
	id, err := h.store.Put(context.Background(), reqs)
	if err != nil {
		h.t.Fatalf("put: %v", err)
	}
	return id
}

// drain collects acks until every batch in want has want[id] terminal acks,
// checking the ack protocol on the way.
func (h *harness) drain(want map[tiers.BatchID]int, d time.Duration) {
	h.t.Helper()
	deadline := time.Now().Add(d)
	for {
		for _, a := range h.store.DrainAcks(nil) {
			h.acks[a.Batch] = append(h.acks[a.Batch], a)
		}
		done := true
		for id, n := range want {
			if terminal(h.acks[id]) < n {
				done = false
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting for terminal acks %v; have %v", want, h.acks)
		}
		select {
		case <-h.store.AckReady():
		case <-time.After(10 * time.Millisecond):
		}
	}
	for id := range want {
		checkAckProtocol(h.t, id, h.acks[id], want[id])
	}
}

func terminal(acks []tiers.Ack) int {
	n := 0
	for _, a := range acks {
		if a.Stage != tiers.AckGathered {
			n++
		}
	}
	return n
}

// checkAckProtocol: per item at most one gathered, exactly one terminal,
// gathered never after terminal.
func checkAckProtocol(t *testing.T, id tiers.BatchID, acks []tiers.Ack, n int) {
	t.Helper()
	gathered := make([]int, n)
	term := make([]int, n)
	for _, a := range acks {
		if a.Index < 0 || a.Index >= n {
			t.Fatalf("batch %d: ack for item %d of %d", id, a.Index, n)
		}
		switch a.Stage {
		case tiers.AckGathered:
			if term[a.Index] > 0 {
				t.Fatalf("batch %d item %d: gathered after terminal", id, a.Index)
			}
			gathered[a.Index]++
		default:
			term[a.Index]++
		}
	}
	for i := range n {
		if gathered[i] > 1 || term[i] != 1 {
			t.Fatalf("batch %d item %d: %d gathered and %d terminal acks, want <=1 and 1", id, i, gathered[i], term[i])
		}
	}
}

// durable reports whether every item of batch id was acked durable.
func (h *harness) durable(id tiers.BatchID) bool {
	for _, a := range h.acks[id] {
		if a.Stage == tiers.AckFailed {
			return false
		}
	}
	return len(h.acks[id]) > 0
}

// get reads ps into slots base.. and checks that every hit is exact; it
// returns the number of hits.
func (h *harness) get(base int, ps []testPage) (hits int, results []error) {
	h.t.Helper()
	reqs := make([]tiers.GetRequest, len(ps))
	for i, p := range ps {
		b, _ := h.slab.Bytes(h.span(base + i))
		clear(b)
		reqs[i] = tiers.GetRequest{Key: p.key, Dst: h.span(base + i)}
	}
	results = make([]error, len(ps))
	if err := h.store.Get(context.Background(), reqs, results); err != nil {
		h.t.Fatalf("get: %v (a plugin failure must be misses, not a failed call)", err)
	}
	for i, r := range results {
		if r != nil {
			if !errors.Is(r, tiers.ErrMiss) {
				h.t.Fatalf("get item %d: %v does not wrap tiers.ErrMiss", i, r)
			}
			continue
		}
		b, _ := h.slab.Bytes(h.span(base + i))
		if !bytes.Equal(b, ps[i].data) {
			h.t.Fatalf("get item %d (%s): a hit with wrong bytes", i, ps[i].key)
		}
		hits++
	}
	return hits, results
}

// restarted reports that the store is up again after a restart (the
// supervisor counts the restart just after the process is installed).
func (h *harness) restarted() bool { return h.store.up() && counter(h.store.m.restarts) >= 1 }

// counter reads a counter or gauge.
func counter(m prometheus.Metric) float64 {
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		panic(err)
	}
	if out.Counter != nil {
		return out.Counter.GetValue()
	}
	return out.Gauge.GetValue()
}

// TestCrashMidBatch: the plugin exits inside a Put call, after its store took
// the batch and before the reply. Earlier acks stand, every item of the
// crashed batch is failed exactly once, reads are misses (never wrong bytes)
// while it is down, and the restarted plugin serves again.
func TestCrashMidBatch(t *testing.T) {
	t.Setenv("KVTIER_FAULT_CRASH_ON_PUT", "3")
	h := newHarness(t, fastOptions(), 1)
	first := h.pages(16)
	b1 := h.put(0, first[:8])
	b2 := h.put(8, first[8:])
	h.drain(map[tiers.BatchID]int{b1: 8, b2: 8}, 10*time.Second)
	if !h.durable(b1) || !h.durable(b2) {
		t.Fatalf("batches before the crash not durable: %v", h.acks)
	}
	if hits, _ := h.get(32, first); hits != 16 {
		t.Fatalf("%d of 16 hits before the crash", hits)
	}
	crashed := h.pages(8)
	b3 := h.put(16, crashed) // the plugin exits inside this call
	h.drain(map[tiers.BatchID]int{b3: 8}, 10*time.Second)
	for _, a := range h.acks[b3] {
		if a.Stage == tiers.AckFailed && !errors.Is(a.Err, tiers.ErrBroken) {
			t.Fatalf("failed ack of the crashed batch: %v, want tiers.ErrBroken", a.Err)
		}
	}
	// Acks already delivered for the first batches were not retracted.
	checkAckProtocol(t, b1, h.acks[b1], 8)
	checkAckProtocol(t, b2, h.acks[b2], 8)
	// Whatever the state (down or restarted empty), reads never fail or lie.
	h.get(32, append(first, crashed...))
	waitFor(t, "restart", 20*time.Second, h.restarted)
	if got := counter(h.store.m.failures.WithLabelValues(reasonCrash)); got < 1 {
		t.Fatalf("crash failures = %v, want >= 1", got)
	}
	if got := counter(h.store.m.restarts); got < 1 {
		t.Fatalf("restarts = %v, want >= 1", got)
	}
	again := h.pages(4)
	b4 := h.put(0, again)
	h.drain(map[tiers.BatchID]int{b4: 4}, 10*time.Second)
	if !h.durable(b4) {
		t.Fatalf("put after restart not durable: %v", h.acks[b4])
	}
	if hits, _ := h.get(32, again); hits != 4 {
		t.Fatalf("%d of 4 hits after restart", hits)
	}
}

// TestHangPastDeadline: a Get that hangs returns misses at the call deadline,
// the plugin is marked down and replaced, and the host keeps serving.
func TestHangPastDeadline(t *testing.T) {
	t.Setenv("KVTIER_FAULT_HANG_ON_GET", "2")
	opts := fastOptions()
	opts.CallTimeout = 300 * time.Millisecond
	h := newHarness(t, opts, 2)
	ps := h.pages(4)
	b := h.put(0, ps)
	h.drain(map[tiers.BatchID]int{b: 4}, 10*time.Second)
	if hits, _ := h.get(8, ps); hits != 4 {
		t.Fatalf("%d of 4 hits before the hang", hits)
	}
	start := time.Now()
	hits, res := h.get(8, ps) // hangs in the plugin
	if took := time.Since(start); took > opts.CallTimeout+2*time.Second {
		t.Fatalf("hung get took %v, deadline %v", took, opts.CallTimeout)
	}
	if hits != 0 || !errors.Is(res[0], ErrDown) {
		t.Fatalf("hung get: %d hits, result %v; want misses wrapping ErrDown", hits, res[0])
	}
	if got := counter(h.store.m.failures.WithLabelValues(reasonTimeout)); got != 1 {
		t.Fatalf("timeout failures = %v, want 1", got)
	}
	waitFor(t, "restart", 20*time.Second, h.restarted)
	ps2 := h.pages(2)
	b2 := h.put(0, ps2)
	h.drain(map[tiers.BatchID]int{b2: 2}, 10*time.Second)
	if hits, _ := h.get(8, ps2); hits != 2 {
		t.Fatalf("%d of 2 hits after restart", hits)
	}
}

// TestGarbageGetReply: a reply of the wrong length that claims hits is
// never read as hits; the plugin is marked down as malformed.
func TestGarbageGetReply(t *testing.T) {
	t.Setenv("KVTIER_FAULT_GARBAGE_GET", "1")
	h := newHarness(t, fastOptions(), 3)
	ps := h.pages(6)
	// Not stored: any hit would be a lie.
	hits, res := h.get(0, ps)
	if hits != 0 || !errors.Is(res[0], ErrDown) {
		t.Fatalf("garbage reply: %d hits, %v; want all misses wrapping ErrDown", hits, res[0])
	}
	if got := counter(h.store.m.failures.WithLabelValues(reasonMalformed)); got != 1 {
		t.Fatalf("malformed failures = %v, want 1", got)
	}
	waitFor(t, "restart", 20*time.Second, h.restarted)
}

// TestGarbageAcks: an ack with an unset stage marks the plugin down; every
// item still ends with exactly one terminal ack.
func TestGarbageAcks(t *testing.T) {
	t.Setenv("KVTIER_FAULT_GARBAGE_ACKS", "1")
	h := newHarness(t, fastOptions(), 4)
	ps := h.pages(5)
	b := h.put(0, ps)
	h.drain(map[tiers.BatchID]int{b: 5}, 10*time.Second)
	if h.durable(b) {
		t.Fatalf("batch with a garbage ack counted durable: %v", h.acks[b])
	}
	if got := counter(h.store.m.failures.WithLabelValues(reasonMalformed)); got != 1 {
		t.Fatalf("malformed failures = %v, want 1", got)
	}
	waitFor(t, "restart", 20*time.Second, h.restarted)
}

// TestKilledDuringBatchesAndRestartFailsOnStdout: the plugin is SIGKILLed
// while batches are in flight; its replacement prints to stdout before the
// handshake, so restarts fail until that is fixed, and the breaker opens.
// The host serves misses and failed writes throughout and recovers.
func TestKilledDuringBatchesAndRestartFailsOnStdout(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "print-to-stdout")
	t.Setenv("KVTIER_FAULT_STDOUT_MARKER", marker)
	opts := fastOptions()
	opts.BreakerFailures = 2
	opts.BreakerCooldown = 300 * time.Millisecond
	h := newHarness(t, opts, 5)
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	pid := h.store.pid()
	var ids []tiers.BatchID
	want := map[tiers.BatchID]int{}
	for i := range 12 {
		ps := h.pages(8)
		id := h.put((i%4)*8, ps)
		ids = append(ids, id)
		want[id] = 8
		if i == 5 {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	}
	h.drain(want, 20*time.Second)
	if last := ids[len(ids)-1]; h.durable(last) {
		t.Fatalf("batch %d, put after the kill with no plugin to restart, acknowledged durable", last)
	}
	waitFor(t, "the breaker to open", 20*time.Second, func() bool { return counter(h.store.m.breakerOpen) == 1 })
	if h.store.up() {
		t.Fatal("a plugin that prints to stdout before the handshake came up")
	}
	// Down: reads miss, writes fail, nothing blocks.
	ps := h.pages(3)
	if hits, _ := h.get(40, ps); hits != 0 {
		t.Fatalf("%d hits from a down plugin", hits)
	}
	b := h.put(40, ps)
	h.drain(map[tiers.BatchID]int{b: 3}, time.Second)
	if h.durable(b) {
		t.Fatal("put to a down plugin acknowledged durable")
	}
	// The crash and at least one failed restart opened the breaker
	// (BreakerFailures = 2).
	if counter(h.store.m.failures.WithLabelValues(reasonStart)) < 1 {
		t.Fatalf("start failures = %v, want >= 1", counter(h.store.m.failures.WithLabelValues(reasonStart)))
	}
	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	// The breaker closes on the successful restart.
	waitFor(t, "recovery after the fix, breaker closed", 20*time.Second, func() bool {
		return h.store.up() && counter(h.store.m.breakerOpen) == 0
	})
	b = h.put(40, ps)
	h.drain(map[tiers.BatchID]int{b: 3}, 10*time.Second)
	if hits, _ := h.get(48, ps); hits != 3 {
		t.Fatalf("%d of 3 hits after recovery", hits)
	}
}

// TestRefusals: each way a plugin is refused at open says which and why.
func TestRefusals(t *testing.T) {
	fault, faultSum := pluginBinary(t, faultPkg)
	mem, memSum := pluginBinary(t, "plugins/examples/memstore")
	wrong := strings.Repeat("ab", 32)
	cases := []struct {
		name    string
		env     map[string]string
		spec    PluginSpec
		index   bool
		want    error
		mention []string
	}{
		{name: "checksum", spec: PluginSpec{Path: mem, SHA256: wrong}, want: ErrChecksum, mention: []string{wrong, memSum}},
		{name: "stdout before handshake", env: map[string]string{"KVTIER_FAULT_STDOUT_ALWAYS": "1"},
			spec: PluginSpec{Path: fault, SHA256: faultSum}, want: ErrHandshake, mention: []string{"hello from stdout", "stdout"}},
		{name: "hangs before the handshake", env: map[string]string{"KVTIER_FAULT_HANG_AT_START": "1"},
			spec: PluginSpec{Path: fault, SHA256: faultSum, Options: Options{StartTimeout: 500 * time.Millisecond}}, want: ErrHandshake, mention: []string{"no handshake within 500ms"}},
		{name: "no slab mapping", env: map[string]string{"KVTIER_FAULT_NO_SLAB": "1"},
			spec: PluginSpec{Path: fault, SHA256: faultSum}, want: ErrNoSlabMapping, mention: []string{"never over gRPC"}},
		{name: "store plugin opened as index", spec: PluginSpec{Path: mem, SHA256: memSum}, index: true, want: ErrHandshake, mention: []string{"kvtier.index.v1"}},
		{name: "missing binary", spec: PluginSpec{Path: mem + ".gone", SHA256: memSum}, mention: []string{"no such file"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			tc.spec.Name = "refused"
			opts := fastOptions()
			if tc.spec.Options.StartTimeout != 0 {
				opts.StartTimeout = tc.spec.Options.StartTimeout
			}
			tc.spec.Options = opts
			var err error
			if tc.index {
				var x *Index
				x, err = OpenIndex(context.Background(), indexes.Env{Logger: testLogger(t, nil), Dir: t.TempDir()}, tc.spec)
				if err == nil {
					x.Close()
				}
			} else {
				var s *Store
				s, err = OpenStore(context.Background(), storeEnv(t, newSlab(t, 64*slot), nil), tc.spec)
				if err == nil {
					s.Close()
				}
			}
			if err == nil {
				t.Fatal("opened; want a refusal")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			for _, m := range tc.mention {
				if !strings.Contains(err.Error(), m) {
					t.Fatalf("err = %q does not mention %q", err, m)
				}
			}
		})
	}
}

// TestNoCommonVersion: a host that offers only version 2 is refused by an
// SDK plugin that speaks 1, and the error names both lists.
func TestNoCommonVersion(t *testing.T) {
	mem, sum := pluginBinary(t, "plugins/examples/memstore")
	opts := fastOptions()
	opts.hostVersions = []int{2}
	_, err := OpenStore(context.Background(), storeEnv(t, newSlab(t, 64*slot), nil), PluginSpec{Name: "old", Path: mem, SHA256: sum, Options: opts})
	if !errors.Is(err, ErrNoCommonVersion) {
		t.Fatalf("err = %v, want ErrNoCommonVersion", err)
	}
	for _, m := range []string{"host speaks [2]", "plugin speaks [1]"} {
		if !strings.Contains(err.Error(), m) {
			t.Fatalf("err = %q does not say %q", err, m)
		}
	}
}

// TestPluginLogsBridged: the plugin's JSON log lines reach the host's slog
// with their level, fields and the plugin's name.
func TestPluginLogsBridged(t *testing.T) {
	mem, sum := pluginBinary(t, "plugins/examples/memstore")
	var logs logBuffer
	st, err := OpenStore(context.Background(), storeEnv(t, newSlab(t, 64*slot), &logs), PluginSpec{Name: "bridged", Path: mem, SHA256: sum, Options: fastOptions()})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, `msg="store plugin open"`) {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("the plugin's open log line did not reach the host log:\n%s", out)
	}
	for _, want := range []string{"level=INFO", "plugin=bridged", "impl=memstore", "backing=shm"} {
		if !strings.Contains(line, want) {
			t.Fatalf("bridged line %q lacks %q", line, want)
		}
	}
}

var _ = fmt.Sprint

// TestAcksNeverCome: a plugin that answers every call but never acks a put
// is hung: past the ack deadline it is marked down and every item of the
// batch is failed, so the host gets its slab spans back.
func TestAcksNeverCome(t *testing.T) {
	t.Setenv("KVTIER_FAULT_DROP_ACKS", "1")
	opts := fastOptions()
	opts.AckTimeout = 400 * time.Millisecond
	h := newHarness(t, opts, 8)
	ps := h.pages(4)
	start := time.Now()
	b := h.put(0, ps)
	h.drain(map[tiers.BatchID]int{b: 4}, 10*time.Second)
	if took := time.Since(start); took < opts.AckTimeout {
		t.Fatalf("items failed after %v, before the %v ack deadline: %v", took, opts.AckTimeout, h.acks[b])
	}
	if h.durable(b) {
		t.Fatalf("batch without acks counted durable: %v", h.acks[b])
	}
	for _, a := range h.acks[b] {
		if !errors.Is(a.Err, ErrDown) {
			t.Fatalf("ack %+v: want an error wrapping ErrDown", a)
		}
	}
	if got := counter(h.store.m.failures.WithLabelValues(reasonTimeout)); got != 1 {
		t.Fatalf("timeout failures = %v, want 1", got)
	}
}

// TestConcurrentUseAcrossKills: four writers and readers share the store
// while its plugin is SIGKILLed twice. Every item of every batch gets
// exactly one terminal ack, every hit is byte-exact, no call fails as a
// whole, and the store serves again at the end. Run it under -race.
func TestConcurrentUseAcrossKills(t *testing.T) {
	h := newHarness(t, fastOptions(), 9)
	const workers, rounds, per = 4, 12, 4
	pages := make([][]testPage, workers)
	for w := range pages {
		pages[w] = h.pages(rounds * per)
	}
	var mu sync.Mutex
	acks := map[tiers.BatchID][]tiers.Ack{}
	sizes := map[tiers.BatchID]int{}
	stop := make(chan struct{})
	drained := make(chan struct{})
	go func() { // one drainer, as a host's tick
		defer close(drained)
		for {
			got := h.store.DrainAcks(nil)
			mu.Lock()
			for _, a := range got {
				acks[a.Batch] = append(acks[a.Batch], a)
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-h.store.AckReady():
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	ctx := context.Background()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			base := w * 2 * per // each worker owns 2*per slots: put slots, then get slots
			for r := range rounds {
				ps := pages[w][r*per : (r+1)*per]
				reqs := make([]tiers.PutRequest, per)
				for i, p := range ps {
					sp := h.span(base + i)
					b, _ := h.slab.Bytes(sp)
					copy(b, p.data)
					reqs[i] = tiers.PutRequest{Key: p.key, Src: sp}
				}
				id, err := h.store.Put(ctx, reqs)
				if err != nil {
					errs <- fmt.Errorf("worker %d put: %w", w, err)
					return
				}
				mu.Lock()
				sizes[id] = per
				mu.Unlock()
				// Wait for this batch to end before reusing its slots.
				for deadline := time.Now().Add(20 * time.Second); ; {
					mu.Lock()
					n := terminal(acks[id])
					mu.Unlock()
					if n == per {
						break
					}
					if time.Now().After(deadline) {
						errs <- fmt.Errorf("worker %d batch %d: %d of %d terminal acks", w, id, n, per)
						return
					}
					time.Sleep(time.Millisecond)
				}
				gets := make([]tiers.GetRequest, per)
				for i, p := range ps {
					gets[i] = tiers.GetRequest{Key: p.key, Dst: h.span(base + per + i)}
				}
				res := make([]error, per)
				if err := h.store.Get(ctx, gets, res); err != nil {
					errs <- fmt.Errorf("worker %d get: %w", w, err)
					return
				}
				for i, e := range res {
					if e != nil {
						continue
					}
					b, _ := h.slab.Bytes(gets[i].Dst)
					if !bytes.Equal(b, ps[i].data) {
						errs <- fmt.Errorf("worker %d: %s hit with wrong bytes", w, ps[i].key)
						return
					}
				}
			}
		}()
	}
	for range 2 {
		time.Sleep(30 * time.Millisecond)
		pid := h.store.PID()
		if pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		// Serving again means a new process, not the killed one before
		// its death was noticed.
		waitFor(t, "restart after a kill", 20*time.Second, func() bool {
			p := h.store.PID()
			return p != 0 && p != pid
		})
	}
	wg.Wait()
	close(stop)
	<-drained
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, n := range sizes {
		checkAckProtocol(t, id, acks[id], n)
	}
	ps := h.pages(2)
	b := h.put(0, ps)
	h.drain(map[tiers.BatchID]int{b: 2}, 10*time.Second)
	if hits, _ := h.get(8, ps); hits != 2 || !h.durable(b) {
		t.Fatalf("after the kills: %d of 2 hits, durable %v", hits, h.durable(b))
	}
}

// TestCloseWhileRestartsFail: Close returns promptly while the plugin is
// down and every restart attempt fails, and leaves no process behind.
func TestCloseWhileRestartsFail(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "print-to-stdout")
	t.Setenv("KVTIER_FAULT_STDOUT_MARKER", marker)
	h := newHarness(t, fastOptions(), 10)
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	pid := h.store.PID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a failed restart", 20*time.Second, func() bool {
		return counter(h.store.m.failures.WithLabelValues(reasonStart)) >= 1
	})
	start := time.Now()
	if err := h.store.Close(); err != nil {
		t.Fatalf("close while down: %v", err)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Fatalf("close while down took %v", took)
	}
	if _, err := h.store.Put(context.Background(), nil); !errors.Is(err, tiers.ErrClosed) {
		t.Fatalf("put after close: %v, want ErrClosed", err)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("plugin process %d still exists after close", pid)
	}
}

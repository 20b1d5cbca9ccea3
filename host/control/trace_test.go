package control

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"testing"
	"time"

	"github.com/kvtier/kvtier/internal/measure"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/workload"
)

const sharedTrace = "../../../shared/traces/mooncake_synthetic_trace.jsonl"

// traceKeys reads the shared Mooncake trace as page keys (one trace block
// = one page; the id is already prefix-chained).
func traceKeys(tb testing.TB) [][]pagehash.Hash {
	reqs, err := workload.ReadFile(sharedTrace)
	if errors.Is(err, fs.ErrNotExist) {
		tb.Skipf("shared trace not found at %s", sharedTrace)
	}
	if err != nil {
		tb.Fatal(err)
	}
	keys := make([][]pagehash.Hash, len(reqs))
	for i, r := range reqs {
		keys[i] = make([]pagehash.Hash, len(r.HashIDs))
		for j, id := range r.HashIDs {
			binary.LittleEndian.PutUint64(keys[i][j][0:8], id)
			binary.LittleEndian.PutUint64(keys[i][j][8:16], ^id)
		}
	}
	return keys
}

// traceRun is a minimal one-rank driver: every op finishes at once and ok,
// the Store is a set of durable pages, the group ticks after every event.
type traceRun struct {
	m     *Machine
	store map[pagehash.Hash]bool
	// hits by tier, input pages, page events.
	hit    [4]int
	input  int
	events int
}

func (r *traceRun) drain(tb testing.TB) {
	rd := r.m.Output() // NB: the contribution is taken at the tick
	r.m.Advance()
	seen := map[OpID]bool{}
	for _, c := range rd.Copies {
		if !seen[c.Op] {
			seen[c.Op] = true
			r.done(tb, c.Op, StageCopied, true)
		}
	}
	for _, p := range rd.Puts {
		r.done(tb, p.Op, StageGathered, true)
		r.done(tb, p.Op, StageDurable, true)
		for _, h := range p.Hashes {
			r.store[h] = true
		}
	}
	for _, l := range rd.Lookups {
		n := 0
		for n < len(l.Hashes) && r.store[l.Hashes[n]] {
			n++
		}
		if err := r.m.Longest(l.Op, n); err != nil {
			tb.Fatal(err)
		}
	}
	for _, g := range rd.Gets {
		r.done(tb, g.Op, StageLoaded, true)
	}
}

func (r *traceRun) done(tb testing.TB, op OpID, st Stage, ok bool) {
	if err := r.m.Done(op, st, ok); err != nil {
		tb.Fatal(err)
	}
}

func (r *traceRun) tick(tb testing.TB) {
	r.drain(tb)
	f, err := Reduce(r.m.Contribution())
	if err != nil {
		tb.Fatal(err)
	}
	if err := r.m.Tick(f); err != nil {
		tb.Fatal(err)
	}
}

func (r *traceRun) apply(tb testing.TB, e Event) Ready {
	if err := r.m.Apply(e); err != nil {
		tb.Fatal(err)
	}
	return r.m.Output()
}

func (r *traceRun) request(tb testing.TB, req ReqID, key []pagehash.Hash) {
	r.input += len(key)
	rd := r.apply(tb, Event{Kind: EvMatch, Req: req, Pages: len(key), Hashes: key})
	res := rd.Matches[len(rd.Matches)-1]
	first := res
	r.events += len(key)
	// A held request waits for its unhold (ops finish at once, so within
	// a few ticks); after a landed reload it matches again and hits, after
	// anything else it recomputes. Its second match may hold it again for
	// the rest of its key, which it then just waits out.
	for try := 0; res.Held; try++ {
		reason := r.waitUnhold(tb, req)
		if try > 0 || (reason != Loaded && reason != Present) {
			break
		}
		rd = r.apply(tb, Event{Kind: EvMatch, Req: req, Pages: len(key), Hashes: key})
		res = rd.Matches[len(rd.Matches)-1]
		r.events += len(key)
	}
	// Tiers as the first match found them; what the reload added is L3's.
	r.hit[1] += first.L1
	r.hit[2] += first.L2
	r.hit[3] += max(0, res.L1+res.L2-first.L1-first.L2)
	r.drain(tb)
	r.apply(tb, Event{Kind: EvInsert, Req: req, Pages: len(key), Hashes: key})
	r.events += len(key)
	r.tick(tb)
	r.apply(tb, Event{Kind: EvFinish, Req: req})
	r.apply(tb, Event{Kind: EvRelease, Req: req})
	r.tick(tb)
}

// waitUnhold ticks until req is released and returns why.
func (r *traceRun) waitUnhold(tb testing.TB, req ReqID) HoldReason {
	for range 1000 {
		r.tick(tb)
		for _, u := range r.m.Output().Unholds {
			if u.Req == req {
				return u.Reason
			}
		}
	}
	tb.Fatalf("request %d held for 1000 ticks", req)
	return 0
}

func traceOptions() Options {
	o := DefaultOptions()
	o.L1Pages, o.L2 = 2000, SimpleLayout(4000, 4096)
	o.SpillQueueCap, o.SpillInflight = 1024, 64
	o.ReloadMaxInflight, o.ReloadTTL = 16, 64
	o.DigestEvery = 0
	o.Logger = slog.New(slog.DiscardHandler)
	return o
}

// TestMooncakeTrace drives the Machine with the head of the shared trace
// (every op finishing at once): every tier serves hits, nothing breaks an
// invariant (checked every tick in invariants builds), and the run ends
// quiet enough to flush back to a new Machine's state.
func TestMooncakeTrace(t *testing.T) {
	keys := traceKeys(t)
	if len(keys) > 600 {
		keys = keys[:600]
	}
	o := traceOptions()
	o.L1Pages, o.L2 = 300, SimpleLayout(600, 4096)
	m, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	r := &traceRun{m: m, store: map[pagehash.Hash]bool{}}
	for i, k := range keys {
		r.request(t, ReqID(i+1), k)
	}
	t.Logf("%d requests, %d input pages: hits L1 %d, L2 %d, L3 %d; %v", len(keys), r.input, r.hit[1], r.hit[2], r.hit[3], m.Stats())
	for tier := 1; tier <= 3; tier++ {
		if r.hit[tier] == 0 {
			t.Errorf("no hit served from L%d", tier)
		}
	}
	for i := 0; i < 10 && m.ops.Len() > 0; i++ {
		r.tick(t)
	}
	if err := m.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	r.apply(t, Event{Kind: EvFlush})
	fresh, _ := New(o)
	if m.Digest() != fresh.Digest() {
		t.Fatal("flush after the trace: digest differs from a new machine's")
	}
}

// BenchmarkMooncakeTrace measures the Machine's decisions on the whole
// shared trace in metadata mode: page events (pages named by matches and
// inserts) per CPU-second of the process.
func BenchmarkMooncakeTrace(b *testing.B) {
	keys := traceKeys(b)
	for b.Loop() {
		m, err := New(traceOptions())
		if err != nil {
			b.Fatal(err)
		}
		r := &traceRun{m: m, store: map[pagehash.Hash]bool{}}
		cpu0, wall0 := measure.ProcessCPU(), time.Now()
		for i, k := range keys {
			r.request(b, ReqID(i+1), k)
		}
		cpu := measure.ProcessCPU() - cpu0
		b.ReportMetric(float64(r.events)/cpu.Seconds(), "page-events/cpu-s")
		b.ReportMetric(float64(r.hit[1]+r.hit[2]+r.hit[3])/float64(r.input)*100, "hit-%")
		b.Logf("%s", fmt.Sprintf("%d requests %d events cpu %v wall %v hits L1 %d L2 %d L3 %d of %d; L1 admissions %d, planner runs %d", len(keys), r.events, cpu, time.Since(wall0), r.hit[1], r.hit[2], r.hit[3], r.input, m.Count("l1 admit"), m.Count("l1 plan")))
	}
}

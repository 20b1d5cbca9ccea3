package hindsight

import (
	"flag"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvtier/kvtier/host/replay"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/lru"
	"github.com/kvtier/kvtier/policy/policytest"
	"github.com/kvtier/kvtier/policy/proven"
	"github.com/kvtier/kvtier/workload"
)

// capacities are the evaluation points, in tokens.
var capacities = []int64{1_000_000, 3_000_000, 10_000_000, 30_000_000}

// allTraces turns on the full generated-trace check: every workload at
// every capacity (about ten seconds, a minute with -race). By default the
// two held-out workloads run at the two capacities where the cache binds
// hardest.
var allTraces = flag.Bool("all-traces", false, "replay every generated workload at every capacity")

// hitRates replays tr at every capacity of caps with a fresh evictor from
// mk.
func hitRates(t testing.TB, tr *replay.Trace, mk func() policy.Evictor, caps []int64) []float64 {
	t.Helper()
	out := make([]float64, len(caps))
	for i, c := range caps {
		r, err := replay.Run(tr, mk(), c, nil)
		if err != nil {
			t.Fatalf("replay %s at %d tokens: %v", tr.Name, c, err)
		}
		out[i] = r.HitRate
	}
	return out
}

func newLRU() policy.Evictor {
	l, _ := lru.New(policy.Options{})
	return l
}

func newProven() policy.Evictor {
	p, _ := proven.New(policy.Options{})
	return p
}

func newHindsight() policy.Evictor {
	h, _ := New(policy.Options{})
	return h
}

// rates holds one trace's hit rates per capacity.
type rates struct{ lru, proven, hindsight []float64 }

// compare replays tr with lru, proven and hindsight, logs the rows and
// fails t when hindsight is more than 0.5 points below lru anywhere.
func compare(t *testing.T, tr *replay.Trace, caps []int64) rates {
	t.Helper()
	r := rates{hitRates(t, tr, newLRU, caps), hitRates(t, tr, newProven, caps), hitRates(t, tr, newHindsight, caps)}
	for i, c := range caps {
		t.Logf("%s %dM tokens: lru %.2f%% proven %.2f%% hindsight %.2f%% (%+.2f vs lru, %+.2f vs proven)",
			tr.Name, c/1_000_000, 100*r.lru[i], 100*r.proven[i], 100*r.hindsight[i],
			100*(r.hindsight[i]-r.lru[i]), 100*(r.hindsight[i]-r.proven[i]))
		if r.hindsight[i] < r.lru[i]-0.005 {
			t.Errorf("%s at %d tokens: hindsight %.4f is more than 0.5 points below lru %.4f", tr.Name, c, r.hindsight[i], r.lru[i])
		}
	}
	return r
}

// TestMooncakeTrace pins hindsight's figures on the shared synthetic trace
// (used while designing the policy): never more than 0.5 points below lru,
// and at 3M tokens at least 3 points above lru and 1.5 above proven
// (measured: 35.05% against lru 31.51% and proven 33.08%; 33.84% before
// replay reported finished requests and their output lengths).
func TestMooncakeTrace(t *testing.T) {
	reqs := policytest.SharedTrace(t, "mooncake_synthetic_trace.jsonl")
	tr, err := replay.Compile("mooncake_synthetic_trace.jsonl", reqs)
	if err != nil {
		t.Fatal(err)
	}
	r := compare(t, tr, capacities)
	if d := r.hindsight[1] - r.lru[1]; d < 0.03 {
		t.Errorf("at 3M tokens hindsight gains %.2f points over lru, want >= 3", 100*d)
	}
	if d := r.hindsight[1] - r.proven[1]; d < 0.015 {
		t.Errorf("at 3M tokens hindsight gains %.2f points over proven, want >= 1.5", 100*d)
	}
}

// generated is one generated workload of the trace tests.
type generated struct {
	name string
	mod  func(*workload.GeneratorConfig)
	// heldOut: the workload was first replayed after the policy and its
	// defaults were fixed.
	heldOut bool
	// minGain is the least gain over lru at 3M tokens the test asserts.
	minGain float64
}

var workloads = []generated{
	{name: "gen-seed1", mod: func(c *workload.GeneratorConfig) {}, minGain: 0.05},
	{name: "gen-seed7", mod: func(c *workload.GeneratorConfig) { c.Seed = 7 }, minGain: 0.05},
	{name: "gen-seed21-docscan", mod: func(c *workload.GeneratorConfig) {
		c.Seed = 21
		c.Mix = workload.Mix{Chat: 0.4, Document: 0.3, Scan: 0.3}
		c.ActiveConversations = 256
	}, minGain: 0.05},
	{name: "gen-seed33-shortconv", mod: func(c *workload.GeneratorConfig) {
		c.Seed = 33
		c.ActiveConversations = 4096
		c.MeanTurns = 4
	}, minGain: 0.02},
	{name: "heldout-seed101", mod: func(c *workload.GeneratorConfig) { c.Seed = 101 }, heldOut: true, minGain: 0.05},
	{name: "heldout-seed202-docscan", mod: func(c *workload.GeneratorConfig) {
		c.Seed = 202
		c.Mix = workload.Mix{Chat: 0.5, Document: 0.3, Scan: 0.2}
		c.ActiveConversations = 512
	}, heldOut: true, minGain: 0.03},
}

// TestGeneratedTraces replays generator workloads. Seeds 1, 7, 21 and 33
// were looked at while designing the policy; seeds 101 and 202 are held
// out: first replayed after the policy and its defaults were fixed. By
// default only the held-out pair runs, at 1M and 3M tokens.
func TestGeneratedTraces(t *testing.T) {
	if testing.Short() {
		t.Skip("generated traces take seconds each; skipped with -short")
	}
	caps := capacities
	if !*allTraces {
		caps = capacities[:2]
	}
	for _, w := range workloads {
		if !w.heldOut && !*allTraces {
			continue
		}
		t.Run(w.name, func(t *testing.T) {
			cfg := workload.DefaultGeneratorConfig()
			w.mod(&cfg)
			reqs, err := workload.Generate(cfg)
			if err != nil {
				t.Fatal(err)
			}
			tr, err := replay.Compile(w.name, reqs)
			if err != nil {
				t.Fatal(err)
			}
			r := compare(t, tr, caps)
			if d := r.hindsight[1] - r.lru[1]; d < w.minGain {
				t.Errorf("at 3M tokens hindsight gains %.2f points over lru, want >= %.1f", 100*d, 100*w.minGain)
			}
		})
	}
}

// BenchmarkReplay times the host path (radix tree + policy) at 3M tokens
// for lru, proven and hindsight, in block-ops per second, on the generated
// default workload and (when ../shared is present) the shared trace.
func BenchmarkReplay(b *testing.B) {
	reqs, err := workload.Generate(workload.DefaultGeneratorConfig())
	if err != nil {
		b.Fatal(err)
	}
	gen, err := replay.Compile("generated", reqs)
	if err != nil {
		b.Fatal(err)
	}
	traces := []*replay.Trace{gen}
	b.Run("mooncake", func(b *testing.B) {
		reqs := policytest.SharedTrace(b, "mooncake_synthetic_trace.jsonl")
		tr, err := replay.Compile("mooncake", reqs)
		if err != nil {
			b.Fatal(err)
		}
		benchReplay(b, tr)
	})
	for _, tr := range traces {
		b.Run(tr.Name, func(b *testing.B) { benchReplay(b, tr) })
	}
}

func benchReplay(b *testing.B, tr *replay.Trace) {
	for _, p := range []struct {
		name string
		mk   func() policy.Evictor
	}{{"lru", newLRU}, {"proven", newProven}, {Name, newHindsight}} {
		b.Run(p.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := replay.HostReplay(tr, p.mk(), 3_000_000); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(tr.Blocks())*float64(b.N)/b.Elapsed().Seconds(), "block-ops/s")
		})
	}
}

// TestOutputLengthIsLearned checks that hindsight's gain from the output
// length is learned from the trace, not a built-in preference: with the
// shared trace's output lengths inverted (a long answer becomes short) it
// does as well as with the recorded ones, and with them shuffled across
// requests (no information left) it falls back to the output-blind level
// without losing to lru. Measured: recorded 35.05%, inverted 34.93%,
// shuffled 34.18%, lru 31.51% at 3M tokens.
func TestOutputLengthIsLearned(t *testing.T) {
	reqs := policytest.SharedTrace(t, "mooncake_synthetic_trace.jsonl")
	rate := func(name string, rewrite func([]workload.Request)) float64 {
		t.Helper()
		rs := slices.Clone(reqs)
		rewrite(rs)
		tr, err := replay.Compile(name, rs)
		if err != nil {
			t.Fatal(err)
		}
		r := hitRates(t, tr, newHindsight, capacities[1:2])[0]
		t.Logf("%s: hindsight %.2f%% at 3M tokens", name, 100*r)
		return r
	}
	recorded := rate("recorded", func([]workload.Request) {})
	inverted := rate("inverted", func(rs []workload.Request) {
		for i := range rs {
			rs[i].OutputLength = 65536 / (rs[i].OutputLength + 1)
		}
	})
	const seed = 12345
	shuffled := rate("shuffled", func(rs []workload.Request) {
		rng := rand.New(rand.NewPCG(seed, 0))
		rng.Shuffle(len(rs), func(i, j int) { rs[i].OutputLength, rs[j].OutputLength = rs[j].OutputLength, rs[i].OutputLength })
	})
	tr, err := replay.Compile("lru", reqs)
	if err != nil {
		t.Fatal(err)
	}
	lruRate := hitRates(t, tr, newLRU, capacities[1:2])[0]
	if d := recorded - inverted; d > 0.005 || d < -0.005 {
		t.Errorf("inverted output lengths: %.2f%% against %.2f%% recorded; a learned signal is blind to the direction", 100*inverted, 100*recorded)
	}
	if recorded-shuffled < 0.005 {
		t.Errorf("shuffled output lengths (seed %d): %.2f%%, recorded %.2f%%; the information should be what helps", seed, 100*shuffled, 100*recorded)
	}
	if shuffled-lruRate < 0.015 {
		t.Errorf("shuffled output lengths (seed %d): %.2f%%, only %.2f points over lru", seed, 100*shuffled, 100*(shuffled-lruRate))
	}
}

// silent hides hindsight's RequestObserver ability from the tree, as a
// host that never reports finished requests would.
type silent struct{ *Hindsight }

func (s silent) Finished() {} // NB: shadows the promoted method; not policy.RequestObserver

// TestWithoutReports checks the fallback of a host that never reports
// finished requests: every leaf keeps its output-blind signature, whose
// rate is the second attempt's predictor, so the figures are the second
// attempt's (measured: 15.74% / 33.84% / 60.19% at 1M / 3M / 10M).
func TestWithoutReports(t *testing.T) {
	reqs := policytest.SharedTrace(t, "mooncake_synthetic_trace.jsonl")
	tr, err := replay.Compile("mooncake_synthetic_trace.jsonl", reqs)
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{0.1574, 0.3384, 0.6019}
	got := hitRates(t, tr, func() policy.Evictor {
		h, _ := New(policy.Options{})
		return silent{h}
	}, capacities[:3])
	for i := range want {
		t.Logf("%dM tokens without reports: %.2f%%", capacities[i]/1_000_000, 100*got[i])
		if d := got[i] - want[i]; d > 0.0001 || d < -0.0001 {
			t.Errorf("%d tokens without reports: %.4f, want the second attempt's %.4f", capacities[i], got[i], want[i])
		}
	}
	if _, ok := policy.Evictor(silent{}).(policy.RequestObserver); ok {
		t.Fatal("silent still reports: the test measures nothing")
	}
}

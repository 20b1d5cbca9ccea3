package replay

import (
	"testing"

	"github.com/kvtier/kvtier/workload"
)

// benchTrace is the shared Mooncake trace, or the built-in generated
// workload (said in the log) when it is absent, as `kvtier bench radix`.
func benchTrace(b testing.TB) *Trace {
	b.Helper()
	tr, ok := tryShared(b, "mooncake_synthetic_trace.jsonl")
	if !ok {
		b.Log("shared trace absent: benchmarking the built-in generated workload")
		return defaultWorkload(b)
	}
	return tr
}

// defaultWorkload is the built-in generated workload (what `kvtier
// replay` replays without a TRACE).
func defaultWorkload(b testing.TB) *Trace {
	b.Helper()
	reqs, err := workload.Generate(workload.DefaultGeneratorConfig())
	if err != nil {
		b.Fatal(err)
	}
	tr, err := Compile("generated", reqs)
	if err != nil {
		b.Fatal(err)
	}
	return tr
}

// BenchmarkHostReplay times one replay of the trace through the host path
// (radix + lru + clock) at 3M tokens; block-ops/s is the figure. Run with
// -cpu 1 for the one-core number.
func BenchmarkHostReplay(b *testing.B) {
	benchHost(b, benchTrace(b))
}

// BenchmarkHostReplayGenerated is BenchmarkHostReplay on the built-in
// generated workload.
func BenchmarkHostReplayGenerated(b *testing.B) {
	benchHost(b, defaultWorkload(b))
}

// BenchmarkNaiveLRUGenerated is BenchmarkNaiveLRU on the generated
// workload.
func BenchmarkNaiveLRUGenerated(b *testing.B) {
	benchNaive(b, defaultWorkload(b))
}

func benchHost(b *testing.B, tr *Trace) {
	reg := registry(b)
	for _, name := range []string{"lru", "slru", "s3fifo", "sieve"} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ev, err := NewEvictor(reg, tr, Spec{Name: name})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := HostReplay(tr, ev, 3_000_000); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*tr.Blocks())/b.Elapsed().Seconds(), "block-ops/s")
		})
	}
}

// BenchmarkNaiveLRU times the naive map+list LRU over the same blocks: the
// limit the host path is compared with.
func BenchmarkNaiveLRU(b *testing.B) {
	benchNaive(b, benchTrace(b))
}

func benchNaive(b *testing.B, tr *Trace) {
	b.ReportAllocs()
	for b.Loop() {
		NaiveLRUReplay(tr, 3_000_000)
	}
	b.ReportMetric(float64(b.N*tr.Blocks())/b.Elapsed().Seconds(), "block-ops/s")
}

// TestBenchReports runs Bench briefly: both sides ran and the ratio is
// their quotient (a smoke test; the figures come from the benchmarks).
func TestBenchReports(t *testing.T) {
	tr := generated(t)
	r, err := Bench(tr, registry(t), BenchConfig{Rounds: 1, MinRound: 1, OneCore: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.HostOpsPerSec <= 0 || r.NaiveOpsPerSec <= 0 || r.BlockOps != tr.Blocks() {
		t.Fatalf("bench result %+v", r)
	}
	if r.Ratio() != r.HostOpsPerSec/r.NaiveOpsPerSec {
		t.Errorf("ratio %v", r.Ratio())
	}
	if r.HostHitRate <= 0 || r.NaiveHitRate <= 0 {
		t.Errorf("a side hit nothing: %+v", r)
	}
}

// BenchmarkMachineReplay times MachineReplay on the trace with the options
// of `kvtier bench host`'s host/decisions row; page-events/s is the figure
// (the row divides by CPU time instead).
func BenchmarkMachineReplay(b *testing.B) {
	tr := benchTrace(b)
	o := DecisionOptions()
	b.ReportAllocs()
	var events int64
	for b.Loop() {
		r, err := MachineReplay(tr, o, MachineConfig{})
		if err != nil {
			b.Fatal(err)
		}
		events += r.PageEvents
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "page-events/s")
}

// BenchmarkIdleTicks times IdleTicks, the tick protocol alone on a Machine
// with nothing in flight (the host/decisions-tick-floor row's side);
// ns/tick is the figure.
func BenchmarkIdleTicks(b *testing.B) {
	const ticks = 1000
	o := DecisionOptions()
	for b.Loop() {
		if err := IdleTicks(o, ticks); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*ticks), "ns/tick")
}

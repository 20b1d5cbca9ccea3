package indexbench

import (
	"github.com/kvtier/kvtier/internal/measure"

	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/badger"
	"github.com/kvtier/kvtier/indexes/lmdb"
	"github.com/kvtier/kvtier/internal/benchreport"
)

var (
	report     = flag.Bool("report", false, "run TestReport: the full Index-v1-vs-raw comparison, printed as a bench table")
	reportJSON = flag.Bool("report.json", false, "print TestReport's results as JSON lines")
	reportSync = flag.Bool("report.sync", false, "run TestReport with sync on for both sides")
)

// TestReport runs the comparison at its default size and prints the
// results, the figures docs/perf.md quotes. It is opt-in (-report): it
// takes tens of seconds and measures speed, which a unit test never
// asserts.
func TestReport(t *testing.T) {
	if !*report {
		t.Skip("opt-in: go test ./internal/bench/indexbench -run TestReport -report")
	}
	o := DefaultOptions()
	o.Dir, o.Sync = t.TempDir(), *reportSync
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if err := benchreport.Write(os.Stdout, res, *reportJSON); err != nil {
		t.Fatal(err)
	}
}

// TestRunSmall checks the shape of a tiny run: one put and one get result
// per index, each with its raw-library limit and ratio. It asserts no
// speed; speed is what the benchmarks below and `kvtier bench l3` report.
func TestRunSmall(t *testing.T) {
	o := Options{Dir: t.TempDir(), Entries: 500, Batch: 64, Rounds: 2, Seed: 3}
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"index/lmdb/put", "index/lmdb/get", "index/badger/put", "index/badger/get"}
	if len(res) != len(want) {
		t.Fatalf("%d results, want %d: %+v", len(res), len(want), res)
	}
	for i, r := range res {
		if r.Bench != want[i] || r.Unit != "entries/s" || r.Value <= 0 || r.Limit <= 0 || r.Ratio <= 0 || r.Target != Target {
			t.Errorf("result %d = %+v, want bench %s with positive value, limit and ratio", i, r, want[i])
		}
		if !strings.HasPrefix(r.LimitName, "raw ") {
			t.Errorf("result %d limit name %q, want the raw library", i, r.LimitName)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []Options{{Entries: 0, Batch: 1, Rounds: 1}, {Entries: 1, Batch: 0, Rounds: 1}, {Entries: 1, Batch: 1, Rounds: 0}} {
		if _, err := Run(context.Background(), o); err == nil {
			t.Errorf("options %+v accepted", o)
		}
	}
}

// BenchmarkBatches measures one batch of Put and of Get per iteration
// through Index v1 and through the raw library, for each index: ns, bytes
// and allocations per batch. Its sub-benchmarks run one after the other, so
// on a shared machine their ratio is at the mercy of the load; the ratio
// the project tracks comes from BenchmarkIndexVsRaw and TestReport.
func BenchmarkBatches(b *testing.B) {
	const batch, preload = 256, 200 * 256
	sides := []struct {
		name string
		open func(dir string) (Side, error)
	}{
		{"lmdb/index", func(dir string) (Side, error) {
			c := lmdb.DefaultConfig()
			c.Sync, c.MapSizeBytes = lmdb.SyncNone, 8<<30
			return NewLMDBIndexSide(context.Background(), dir, c)
		}},
		{"lmdb/raw", func(dir string) (Side, error) {
			c := lmdb.DefaultConfig()
			c.Sync, c.MapSizeBytes = lmdb.SyncNone, 8<<30
			return NewLMDBRawSide(dir, c)
		}},
		{"badger/index", func(dir string) (Side, error) {
			c := badger.DefaultConfig()
			c.Sync = false
			return NewBadgerIndexSide(context.Background(), dir, c)
		}},
		{"badger/raw", func(dir string) (Side, error) {
			c := badger.DefaultConfig()
			c.Sync = false
			return NewBadgerRawSide(dir, c)
		}},
	}
	w := newWorkload(Options{Entries: preload, Rounds: 1, Seed: 9})
	for _, s := range sides {
		for _, op := range []string{"put", "get"} {
			b.Run(fmt.Sprintf("%s/%s", s.name, op), func(b *testing.B) {
				side, err := s.open(b.TempDir())
				if err != nil {
					b.Fatal(err)
				}
				defer side.Close()
				for i := 0; i+batch <= preload; i += batch {
					if err := side.Put(w.rounds[0][i:i+batch], w.keys[0][i:i+batch], w.vals[0][i:i+batch]); err != nil {
						b.Fatal(err)
					}
				}
				keys := make([]indexes.Key, batch)
				b.ReportAllocs()
				b.ResetTimer()
				for n := 0; b.Loop(); n++ {
					i := (n * batch) % (preload - batch)
					switch op {
					case "put":
						err = side.Put(w.rounds[0][i:i+batch], w.keys[0][i:i+batch], w.vals[0][i:i+batch])
					case "get":
						for j := range keys {
							keys[j] = w.rounds[0][i+j].Key
						}
						err = side.Get(keys, w.keys[0][i:i+batch])
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "entries/s")
			})
		}
	}
}

// BenchmarkIndexVsRaw runs, per iteration, one interleaved comparison of
// 20,480 puts then 20,480 gets (batches of 256) on the same pair of
// databases, and reports the median ratios of Index v1 to raw-library
// throughput over the iterations (target 0.9). Unlike BenchmarkBatches,
// whose sub-benchmarks run one after the other, the two sides here share
// whatever load the machine has.
func BenchmarkIndexVsRaw(b *testing.B) {
	pairs := []struct {
		name       string
		index, raw func(dir string) (Side, error)
	}{
		{"lmdb", func(dir string) (Side, error) {
			c := lmdb.DefaultConfig()
			c.Sync, c.MapSizeBytes = lmdb.SyncNone, 8<<30
			return NewLMDBIndexSide(context.Background(), dir, c)
		}, func(dir string) (Side, error) {
			c := lmdb.DefaultConfig()
			c.Sync, c.MapSizeBytes = lmdb.SyncNone, 8<<30
			return NewLMDBRawSide(dir, c)
		}},
		{"badger", func(dir string) (Side, error) {
			c := badger.DefaultConfig()
			c.Sync = false
			return NewBadgerIndexSide(context.Background(), dir, c)
		}, func(dir string) (Side, error) {
			c := badger.DefaultConfig()
			c.Sync = false
			return NewBadgerRawSide(dir, c)
		}},
	}
	for _, p := range pairs {
		b.Run(p.name, func(b *testing.B) {
			index, err := p.index(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			defer index.Close()
			raw, err := p.raw(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			defer raw.Close()
			var putRatios, getRatios []float64
			seed := uint64(0)
			for b.Loop() {
				seed++
				o := Options{Entries: 20480, Batch: 256, Rounds: 1, Seed: seed}
				ip, rp, ig, rg, err := compare(context.Background(), o, index, raw)
				if err != nil {
					b.Fatal(err)
				}
				putRatios = append(putRatios, ip/rp)
				getRatios = append(getRatios, ig/rg)
			}
			b.ReportMetric(measure.Median(putRatios), "put-ratio")
			b.ReportMetric(measure.Median(getRatios), "get-ratio")
		})
	}
}

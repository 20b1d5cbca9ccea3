package indexbench

import (
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
		t.Skip("opt-in: go test ./indexes/indexbench -run TestReport -report")
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
// through Index v1 and through the raw library, for each index. Compare
// index/... with raw/... of the same library and op; the ratio the project
// tracks (target 0.9) is raw ns/op divided by index ns/op.
func BenchmarkBatches(b *testing.B) {
	const batch, preload = 256, 50_000
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

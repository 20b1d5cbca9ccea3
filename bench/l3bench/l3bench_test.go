package l3bench

import (
	"context"
	"flag"
	"os/exec"
	"strings"
	"testing"
)

var benchDir = flag.String("l3bench.dir", "", "file system directory for BenchmarkL3 (default: the test's temp dir)")

// TestRunSmall runs the whole bench on a few small pages: every page is
// spilled, reloaded and verified (with the store's own checksums and with
// the producer's carried in each Put), and fio (when installed) gives
// limits.
func TestRunSmall(t *testing.T) {
	o := DefaultOptions()
	o.Dir, o.PageBytes, o.Pages, o.Batch, o.Depth, o.Rounds = t.TempDir(), 300000, 12, 5, 4, 2
	_, fioErr := exec.LookPath("fio")
	for _, tc := range []struct {
		index string
		sums  bool
	}{{"lmdb", false}, {"badger", false}, {"lmdb", true}} {
		o.Index, o.Sums = tc.index, tc.sums
		res, err := Run(context.Background(), o)
		if err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		if got := strings.Contains(res[0].Note, "producer's CRC-32C"); got != tc.sums {
			t.Fatalf("%+v: spill note %q", tc, res[0].Note)
		}
		want := 2
		if fioErr == nil {
			want = 3
		}
		if len(res) != want || res[0].Bench != "l3/spill" || res[1].Bench != "l3/reload" ||
			(want == 3 && (res[2].Bench != "l3/spill-same-syncs" || !strings.Contains(res[2].LimitName, "fdatasync="))) {
			t.Fatalf("results %+v", res)
		}
		for _, r := range res {
			if r.Value <= 0 || r.Unit != "MiB/s" {
				t.Fatalf("result %+v", r)
			}
			if fioErr == nil && (r.Limit <= 0 || r.Ratio <= 0) {
				t.Fatalf("fio installed but no limit: %+v", r)
			}
			if fioErr != nil && !strings.Contains(r.Note, "no limit measured") {
				t.Fatalf("no fio and no note: %+v", r)
			}
		}
	}
	o.Fio, o.Sums = "-", false
	res, err := Run(context.Background(), o)
	if err != nil || res[0].Limit != 0 || !strings.Contains(res[0].Note, "no limit measured (fio disabled)") {
		t.Fatalf("fio disabled: %+v, %v", res, err)
	}
}

func TestParseFio(t *testing.T) {
	out := `fio: note something
{"fio version":"fio-3.33","jobs":[{"jobname":"x","read":{"bw_bytes":1048576},"write":{"bw_bytes":2097152}}]}`
	for _, tc := range []struct {
		rw   string
		want float64
	}{{"read", 1}, {"write", 2}} {
		got, err := parseFio([]byte(out), tc.rw)
		if err != nil || got != tc.want {
			t.Fatalf("%s: %v, %v; want %v", tc.rw, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "{}", `{"jobs":[]}`, `{"jobs":[{"read":{"bw_bytes":0}}]}`, "not json"} {
		if _, err := parseFio([]byte(bad), "read"); err == nil {
			t.Errorf("parseFio(%q) accepted", bad)
		}
	}
}

// FuzzParseFio: never panics; a positive bandwidth or an error.
func FuzzParseFio(f *testing.F) {
	f.Add([]byte(`{"jobs":[{"read":{"bw_bytes":5},"write":{"bw_bytes":7}}]}`), true)
	f.Add([]byte(`junk {"jobs":[]}`), false)
	f.Fuzz(func(t *testing.T, b []byte, read bool) {
		rw := "write"
		if read {
			rw = "read"
		}
		v, err := parseFio(b, rw)
		if err == nil && !(v > 0) {
			t.Fatalf("no error and bandwidth %v", v)
		}
	})
}

// BenchmarkL3 is `kvtier bench l3` as a Go benchmark: one full run per
// iteration (use -benchtime 1x), reporting MiB/s and the ratios to fio.
func BenchmarkL3(b *testing.B) {
	o := DefaultOptions()
	o.Dir = *benchDir
	if o.Dir == "" {
		o.Dir = b.TempDir()
	}
	for b.Loop() {
		res, err := Run(context.Background(), o)
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range res {
			name := strings.TrimPrefix(r.Bench, "l3/")
			b.ReportMetric(r.Value, name+"-MiB/s")
			if r.Limit > 0 {
				b.ReportMetric(r.Limit, name+"-fio-MiB/s")
				b.ReportMetric(r.Ratio, name+"-ratio")
			}
		}
	}
}

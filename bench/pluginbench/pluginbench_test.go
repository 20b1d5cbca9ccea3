package pluginbench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/tiers"
)

// buildPlugin builds the memstore example plugin into dir.
func buildPlugin(tb testing.TB, dir string) string {
	tb.Helper()
	root, err := sourceRoot()
	if err != nil {
		tb.Fatal(err)
	}
	out := filepath.Join(dir, "kvtier-plugin-memstore")
	cmd := exec.Command("go", "build", "-o", out, "./plugins/examples/memstore")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("build plugin: %v\n%s", err, b)
	}
	return out
}

func slabDir(tb testing.TB) string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return tb.TempDir()
}

// BenchmarkStore puts and gets 2.75 MiB pages through the memstore plugin
// and the in-process memstore, in 1-page and 128-page batches. One
// iteration is one batch; MB/s is page bytes moved. Put waits for every
// durable ack.
func BenchmarkStore(b *testing.B) {
	ctx := context.Background()
	const batch = 128
	p, err := Open(ctx, Config{Plugin: buildPlugin(b, b.TempDir()), SlabDir: slabDir(b), BatchPages: batch})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	for _, side := range []struct {
		name string
		st   tiers.Store
	}{{"inproc", p.InProc}, {"plugin", p.Plugin}} {
		for _, n := range []int{1, batch} {
			b.Run(fmt.Sprintf("put/%s/batch=%d", side.name, n), func(b *testing.B) {
				b.SetBytes(int64(n) * PageBytes)
				for b.Loop() {
					if _, err := p.PutRound(ctx, side.st, p.Keys(n)); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(fmt.Sprintf("get/%s/batch=%d", side.name, n), func(b *testing.B) {
				keys := p.Keys(n)
				if _, err := p.PutRound(ctx, side.st, keys); err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(n) * PageBytes)
				for b.Loop() {
					if _, err := p.GetRound(ctx, side.st, keys); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestRunReports runs the benchmark at its smallest and checks that every
// figure is there and positive, with the in-process store as the limit.
func TestRunReports(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a plugin and moves ~100 MiB")
	}
	results, err := Run(context.Background(), Config{Plugin: buildPlugin(t, t.TempDir()), SlabDir: slabDir(t), BatchPages: 8, Rounds: 2})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, op := range []string{"put", "get"} {
		want["plugin/"+op+"-throughput-8p"] = true
		want["plugin/"+op+"-throughput-8p-best"] = true
		want["plugin/"+op+"-cpu-8p"] = true
		if op == "put" {
			want["plugin/put-ack-delay-1p-p50"] = true
			want["plugin/put-ack-delay-1p-p99"] = true
		}
		for _, n := range []string{"1p", "8p"} {
			for _, q := range []string{"p50", "p99"} {
				want[fmt.Sprintf("plugin/%s-latency-%s-%s", op, n, q)] = true
			}
		}
	}
	for _, r := range results {
		if !want[r.Bench] {
			t.Errorf("unexpected figure %s", r.Bench)
			continue
		}
		delete(want, r.Bench)
		if strings.Contains(r.Bench, "ack-delay") {
			if r.Value < 0 || r.Limit != 0 || !strings.Contains(r.Note, "in process") {
				t.Errorf("%s: value %v limit %v note %q", r.Bench, r.Value, r.Limit, r.Note)
			}
			continue
		}
		if r.Value <= 0 || r.Limit <= 0 || r.Ratio <= 0 || r.LimitName != "in-process memstore" {
			t.Errorf("%s: value %v limit %v (%s) ratio %v, want all positive against the in-process store", r.Bench, r.Value, r.Limit, r.LimitName, r.Ratio)
		}
	}
	for b := range want {
		t.Errorf("missing figure %s", b)
	}
}

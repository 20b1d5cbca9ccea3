package datareplay

import (
	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/host/replay"

	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/workload"
)

// headTrace is the first n requests of the shared trace.
func headTrace(t testing.TB, n int) *replay.Trace {
	t.Helper()
	path := filepath.Join(moduleRoot, "..", "shared", "traces", "mooncake_synthetic_trace.jsonl")
	reqs, err := workload.ReadFile(path)
	if err != nil {
		t.Skipf("shared trace not available (%v): skipping", err)
	}
	tr, err := replay.Compile(fmt.Sprintf("shared head %d", n), reqs[:min(n, len(reqs))])
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// generatedSeeded is a small seeded workload from the generator.
func generatedSeeded(t testing.TB, seed uint64, n int) *replay.Trace {
	t.Helper()
	cfg := workload.DefaultGeneratorConfig()
	cfg.Seed, cfg.Requests = seed, n
	reqs, err := workload.Generate(cfg)
	if err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	tr, err := replay.Compile(fmt.Sprintf("generated seed %d", seed), reqs)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// memstoreYAML is the built-in data stack with L3 replaced by an
// in-memory store of the given capacity.
func memstoreYAML(capacity string) string {
	i := strings.Index(dataYAML, "  - name: l3\n")
	j := strings.Index(dataYAML, "policy:")
	return dataYAML[:i] + "  - name: l3\n    role: store\n    use: memstore\n    config: {capacity: " + capacity + "}\n" + dataYAML[j:]
}

// badgerYAML is the built-in data stack with a Badger index.
func badgerYAML() string {
	return strings.Replace(dataYAML, `index: {use: lmdb, config: {dir: "{{DIR}}/index"}}`, `index: {use: badger, config: {dir: "{{DIR}}/index"}}`, 1)
}

// pluginYAML is the built-in data stack with L3 served by the l3disk
// example plugin (its own Badger index) out of process.
func pluginYAML(path, sum string) string {
	i := strings.Index(dataYAML, "  - name: l3\n")
	j := strings.Index(dataYAML, "policy:")
	return dataYAML[:i] + fmt.Sprintf(`  - name: l3
    role: store
    plugin:
      path: %s
      sha256: %s
      config: {disks: [{dir: "{{DIR}}/l3", budget: 256MiB}], index_dir: "{{DIR}}/index"}
`, path, sum) + dataYAML[j:]
}

// TestDataWrongBytesZero: every hit, from every tier, has the right
// bytes, on the shared trace's head and on generated traces.
func TestDataWrongBytesZero(t *testing.T) {
	cases := []struct {
		name string
		tr   func(testing.TB) *replay.Trace
	}{
		{"shared-head-400", func(tb testing.TB) *replay.Trace { return headTrace(tb, 400) }},
		{"generated-seed-9", func(tb testing.TB) *replay.Trace { return generatedSeeded(tb, 9, 300) }},
		{"generated-seed-7", func(tb testing.TB) *replay.Trace { return generatedSeeded(tb, 7, 300) }},
		{"generated-seed-8", func(tb testing.TB) *replay.Trace { return generatedSeeded(tb, 8, 300) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := c.tr(t)
			res, err := RunData(context.Background(), tr, DataConfig{Dir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: hit rate %.4f by tier %v, verified %d, bytes %+v, skips %v, failed %v, %d ticks, %.2fs",
				tr.Name, res.HitRate, res.HitPagesByTier, res.VerifiedPages, res.Bytes, res.Skips, res.FailedOps, res.Ticks, res.Seconds)
			if res.WrongBytes != 0 {
				t.Fatalf("%d wrong bytes", res.WrongBytes)
			}
			if res.VerifiedPages == 0 || res.HitTokens == 0 {
				t.Fatalf("nothing hit: %+v", res)
			}
			if res.Mode != "data" || res.Requests != tr.Requests() || res.Bytes.L1ToL2 == 0 || !strings.Contains(res.Geometry, "16KiB pages") {
				t.Fatalf("result %+v", res)
			}
		})
	}
}

// metaRate is the metadata replay's hit rate of tr at capacity blocks
// (0: infinite) with lru.
func metaRate(t *testing.T, tr *replay.Trace, blocks int64) float64 {
	t.Helper()
	reg, err := builtin.Policies()
	if err != nil {
		t.Fatal(err)
	}
	spec := replay.Spec{Name: "lru"}
	if blocks == 0 {
		spec.Name = replay.Infinite
	}
	ev, err := replay.NewEvictor(reg, tr, spec)
	if err != nil {
		t.Fatal(err)
	}
	r, err := replay.Run(tr, ev, blocks*workload.BlockTokens, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r.HitRate
}

// TestDataVsMetadata pins the relation between data mode and metadata
// replay at the same capacity. The Machine's tree keeps a page while any
// tier holds it (write-through: L1 ⊆ L2, spilled L2 ⊆ L3), so the total
// capacity is the L3's. With a store whose own GC never binds (a memstore
// larger than the trace), the data hit rate is the infinite bound's less
// what the reload path refuses (capacity skips, a reload's partial
// prefix): within 2 points below it. With the l3disk of the built-in
// stack, whose GC drops pages the tree still lists as L3, the data hit
// rate lies between metadata lru at the L2's pages and at the infinite
// bound, and within 3 points of metadata lru at the L3's pages.
func TestDataVsMetadata(t *testing.T) {
	tr := headTrace(t, 1000)
	inf := metaRate(t, tr, 0)
	l2 := metaRate(t, tr, 1024)
	l3 := metaRate(t, tr, 13107)

	mem, err := RunData(context.Background(), tr, DataConfig{Dir: t.TempDir(), YAML: memstoreYAML("4GiB")})
	if err != nil {
		t.Fatal(err)
	}
	disk, err := RunData(context.Background(), tr, DataConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("metadata lru: L2 pages %.4f, L3 pages %.4f, infinite %.4f; data: memstore %.4f, l3disk %.4f", l2, l3, inf, mem.HitRate, disk.HitRate)
	if mem.WrongBytes != 0 || disk.WrongBytes != 0 {
		t.Fatalf("wrong bytes: memstore %d, l3disk %d", mem.WrongBytes, disk.WrongBytes)
	}
	if mem.HitRate > inf+1e-9 || mem.HitRate < inf-0.02 {
		t.Errorf("memstore data hit rate %.4f not within [infinite-0.02, infinite] = [%.4f, %.4f]", mem.HitRate, inf-0.02, inf)
	}
	if disk.HitRate < l2 || disk.HitRate > inf+1e-9 {
		t.Errorf("l3disk data hit rate %.4f outside [lru@L2 %.4f, infinite %.4f]", disk.HitRate, l2, inf)
	}
	if d := disk.HitRate - l3; d < -0.03 || d > 0.03 {
		t.Errorf("l3disk data hit rate %.4f more than 3 points from lru@L3 %.4f", disk.HitRate, l3)
	}
}

// TestDataMetamorphic replays one trace over a memstore, l3disk with
// LMDB, l3disk with Badger (and the l3disk plugin when `make plugins`
// built it) where no store's own GC binds: every request hits the same
// pages.
func TestDataMetamorphic(t *testing.T) {
	for _, tr := range []*replay.Trace{generatedSeeded(t, 11, 400), headTrace(t, 150)} {
		t.Run(tr.Name, func(t *testing.T) { metamorphic(t, tr) })
	}
}

func metamorphic(t *testing.T, tr *replay.Trace) {
	stacks := []struct{ name, yaml string }{
		{"memstore", memstoreYAML("4GiB")},
		{"l3disk-lmdb", dataYAML},
		{"l3disk-badger", badgerYAML()},
	}
	plugin := filepath.Join(moduleRoot, "bin", "plugins", "kvtier-plugin-l3disk")
	if bin, err := os.ReadFile(plugin); err == nil {
		stacks = append(stacks, struct{ name, yaml string }{"l3disk-plugin", pluginYAML(plugin, fmt.Sprintf("%x", sha256.Sum256(bin)))})
	} else {
		t.Logf("no l3disk plugin at %s (make plugins builds it): its run is skipped", plugin)
	}
	var ref []int
	for _, s := range stacks {
		res, err := RunData(context.Background(), tr, DataConfig{Dir: t.TempDir(), YAML: s.yaml})
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		t.Logf("%s: hit rate %.4f by tier %v, skips %v, failed %v", s.name, res.HitRate, res.HitPagesByTier, res.Skips, res.FailedOps)
		if res.WrongBytes != 0 {
			t.Fatalf("%s: %d wrong bytes", s.name, res.WrongBytes)
		}
		if res.HitPagesByTier["l3"] == 0 {
			t.Fatalf("%s: no L3 hit: the trace does not exercise the store", s.name)
		}
		if ref == nil {
			ref = res.HitSequence
			continue
		}
		if !slices.Equal(ref, res.HitSequence) {
			for i := range ref {
				if ref[i] != res.HitSequence[i] {
					t.Fatalf("%s: request %d hits %d pages, %s hit %d", s.name, i+1, res.HitSequence[i], stacks[0].name, ref[i])
				}
			}
		}
	}
}

// TestDataWritePolicies: every write policy keeps every hit's bytes
// right (write_back backs a node up only when L1 evicts it; selective on
// its second hit).
func TestDataWritePolicies(t *testing.T) {
	tr := headTrace(t, 250)
	for _, wp := range []string{"write_through", "write_through_selective", "write_back"} {
		t.Run(wp, func(t *testing.T) {
			yaml := strings.Replace(dataYAML, "write_policy: write_through", "write_policy: "+wp, 1)
			res, err := RunData(context.Background(), tr, DataConfig{Dir: t.TempDir(), YAML: yaml})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: hit rate %.4f by tier %v, verified %d, bytes %+v, skips %v", wp, res.HitRate, res.HitPagesByTier, res.VerifiedPages, res.Bytes, res.Skips)
			if res.WrongBytes != 0 || res.VerifiedPages == 0 {
				t.Fatalf("%s: wrong bytes %d, verified %d", wp, res.WrongBytes, res.VerifiedPages)
			}
		})
	}
}

// moduleRoot is the repository root seen from this package's directory,
// where go test runs.
var moduleRoot = filepath.Join("..", "..")

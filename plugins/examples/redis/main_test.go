package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/kvtier/kvtier/internal/slabfile"
	"github.com/kvtier/kvtier/plugins/pluginhost"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/redis/redistest"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// buildPlugin builds this package into a temporary binary and returns its
// path and SHA-256.
func buildPlugin(t *testing.T) (string, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "kvtier-plugin-redis")
	cmd := exec.Command("go", "build", "-o", out, ".")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the redis plugin: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return out, hex.EncodeToString(sum[:])
}

func payload() tiers.PayloadGeometry {
	return tiers.PayloadGeometry{PageTokens: 16, Kinds: []tiers.PayloadSpec{
		{Name: "kv", PageBytes: 12 << 10},
		{Name: "index", PageBytes: 3000},
	}}
}

func logger() *slog.Logger {
	var w io.Writer = io.Discard
	if testing.Verbose() {
		w = os.Stderr
	}
	return slog.New(slog.NewTextHandler(w, nil))
}

var prefixSeq atomic.Int64

// TestStoreConformance runs the Store v1 suite, unchanged, against the
// plugin binary on a standalone server and on a 3x1 cluster.
func TestStoreConformance(t *testing.T) {
	redistest.RequireBinaries(t)
	path, sum := buildPlugin(t)
	g := payload()
	slot := g.Kinds[0].PageBytes
	harness := func(mode string, addrs []string) tiertest.StoreHarness {
		var last string
		open := func(t *testing.T, prefix string) (tiers.Store, tiers.Slab) {
			dir := "/dev/shm"
			if st, err := os.Stat(dir); err != nil || !st.IsDir() {
				dir = t.TempDir()
			}
			slab, err := slabfile.Open(context.Background(), nil, dir, "redis-plugin-test", 2*tiertest.SlabPages*slot, false)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { slab.Close() })
			st, err := pluginhost.OpenStore(context.Background(), tiers.Env{
				Logger: logger(), Payload: g, WorldSize: 1, StackID: "redis-plugin-test", Slab: slab, ColdStart: tiers.ColdStartLoad,
			}, pluginhost.PluginSpec{
				Name: "redis", Path: path, SHA256: sum,
				Config: map[string]any{"mode": mode, "addresses": addrs, "key_prefix": prefix, "timeout": "2s"},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st, slab
		}
		return tiertest.StoreHarness{
			Payload: g,
			Open: func(t *testing.T) (tiers.Store, tiers.Slab) {
				last = fmt.Sprintf("kvt-plugin:%d:", prefixSeq.Add(1))
				return open(t, last)
			},
			Reopen: func(t *testing.T) (tiers.Store, tiers.Slab) { return open(t, last) },
		}
	}
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		srv := redistest.StandaloneT(t, redistest.Options{})
		tiertest.RunStore(t, harness("standalone", []string{srv.Addr()}))
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cl := redistest.ClusterT(t, 3, 1, redistest.Options{})
		tiertest.RunStore(t, harness("cluster", cl.Addrs()))
	})
}

package redis_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/redis"
	"github.com/kvtier/kvtier/tiers/redis/redistest"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// geometry has two kinds whose page sizes are not powers of two.
func geometry() tiers.PayloadGeometry {
	return tiers.PayloadGeometry{PageTokens: 64, Kinds: []tiers.PayloadSpec{
		{Name: "kv", PageBytes: 12*1024 + 40},
		{Name: "index", PageBytes: 1000},
	}}
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

var prefixSeq atomic.Int64

// uniquePrefix gives each opened store its own key space on a shared server.
func uniquePrefix(t testing.TB) string {
	name := strings.NewReplacer("/", ".", "{", "(", "}", ")", " ", "_").Replace(t.Name())
	return fmt.Sprintf("kvt:%s:%d:", name, prefixSeq.Add(1))
}

// openStore opens a store on addrs and closes it in t.Cleanup.
func openStore(t testing.TB, cfg redis.Config, slab tiers.Slab) *redis.Store {
	t.Helper()
	st, err := redis.Open(context.Background(), tiers.Env{
		Logger: testLogger(t), Payload: geometry(), WorldSize: 1, Slab: slab, ColdStart: tiers.ColdStartLoad,
	}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func baseConfig(mode string, addrs []string) redis.Config {
	c := redis.DefaultConfig()
	c.Mode = mode
	c.Addresses = addrs
	c.Timeout = 2 * time.Second
	c.ReplicaTimeout = time.Second
	return c
}

// harness runs the suite against fresh key prefixes on one set of servers;
// Reopen opens the same prefix again (the server keeps the pages).
func harness(cfg redis.Config, capacityPages int) tiertest.StoreHarness {
	g := geometry()
	var last string
	open := func(t *testing.T, prefix string) (tiers.Store, tiers.Slab) {
		slab := tiertest.NewHeapSlab(2 * tiertest.SlabPages * g.Kinds[0].PageBytes)
		c := cfg
		c.KeyPrefix = prefix
		return openStore(t, c, slab), slab
	}
	return tiertest.StoreHarness{
		Payload:       g,
		CapacityPages: capacityPages,
		AckTimeout:    10 * time.Second,
		Open: func(t *testing.T) (tiers.Store, tiers.Slab) {
			last = uniquePrefix(t)
			return open(t, last)
		},
		Reopen: func(t *testing.T) (tiers.Store, tiers.Slab) { return open(t, last) },
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	redistest.RequireBinaries(t)
	t.Run("standalone", func(t *testing.T) {
		srv := redistest.StandaloneT(t, redistest.Options{})
		tiertest.RunStore(t, harness(baseConfig(redis.ModeStandalone, []string{srv.Addr()}), 0))
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.ClusterT(t, 3, 1, redistest.Options{})
		tiertest.RunStore(t, harness(baseConfig(redis.ModeCluster, cl.Addrs()), 0))
		t.Run("min_replicas", func(t *testing.T) {
			cfg := baseConfig(redis.ModeCluster, cl.Addrs())
			cfg.MinReplicas = 1
			tiertest.RunStore(t, harness(cfg, 0))
		})
	})
}

package redisbench_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvtier/kvtier/tiers/redis"
	"github.com/kvtier/kvtier/tiers/redis/redisbench"
	"github.com/kvtier/kvtier/tiers/redis/redistest"
)

// TestRunSmall runs the benchmark at its smallest against a standalone
// server and a cluster of 3 masters: every row, positive figures, a ratio.
func TestRunSmall(t *testing.T) {
	redistest.RequireBinaries(t)
	t.Parallel()
	for _, tc := range []struct {
		mode  string
		addrs func(t *testing.T) []string
	}{
		{redis.ModeStandalone, func(t *testing.T) []string {
			return []string{redistest.StandaloneT(t, redistest.Options{}).Addr()}
		}},
		{redis.ModeCluster, func(t *testing.T) []string { return redistest.ClusterT(t, 3, 0, redistest.Options{}).Addrs() }},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			cfg := redis.DefaultConfig()
			cfg.Mode = tc.mode
			cfg.Addresses = tc.addrs(t)
			cfg.Timeout = 10 * time.Second
			res, err := redisbench.Run(context.Background(), redisbench.Config{Store: cfg, PageBytes: 64 << 10, BatchPages: 8, Rounds: 2, Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(res) != 4 || res[0].Bench != "redis/put" || res[1].Bench != "redis/get" || res[2].Bench != "redis/put_own_sum" || res[3].Bench != "redis/put_vs_checksummed" {
				t.Fatalf("rows %+v", res)
			}
			for _, r := range res {
				if r.Value <= 0 || r.Limit <= 0 || r.Ratio <= 0 || r.Unit != "GB/s" {
					t.Fatalf("row %+v", r)
				}
				t.Logf("%s: %.3f GB/s, raw %.3f, ratio %.2f", r.Bench, r.Value, r.Limit, r.Ratio)
			}
		})
	}
}

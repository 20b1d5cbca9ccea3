package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/tiers/redis/redistest"
)

// TestBenchRedisSmall runs `kvtier bench redis` at its smallest: it starts
// its own redis-server and prints its three rows as JSON with the raw
// client as the limit.
func TestBenchRedisSmall(t *testing.T) {
	redistest.RequireBinaries(t)
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"bench", "redis", "--batch", "4", "--page-kib", "64", "--rounds", "2", "--json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("bench redis: %v\n%s", err, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("want 4 JSON lines, got:\n%s", out.String())
	}
	for i, want := range []string{"redis/put", "redis/get", "redis/put_own_sum", "redis/put_vs_checksummed"} {
		var r struct {
			Bench     string  `json:"bench"`
			Value     float64 `json:"value"`
			Unit      string  `json:"unit"`
			Limit     float64 `json:"limit"`
			LimitName string  `json:"limit_name"`
			Ratio     float64 `json:"ratio"`
		}
		if err := json.Unmarshal([]byte(lines[i]), &r); err != nil || r.Bench != want || r.Unit != "GB/s" || r.Value <= 0 || r.Limit <= 0 || r.Ratio <= 0 || r.LimitName == "" {
			t.Fatalf("line %d %q: %+v, %v", i, lines[i], r, err)
		}
	}
	for _, bad := range [][]string{
		{"bench", "redis", "--batch", "0"},
		{"bench", "redis", "--rounds", "x"},
		{"bench", "redis", "extra"},
		{"bench", "redis", "--mode", "cluster"},
		{"bench", "redis", "--addr", "nohost"},
	} {
		if err := run(context.Background(), bad, &out, &errOut); !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestBenchPluginSmall runs `kvtier bench plugin` at its smallest: it
// finds or builds the memstore plugin and prints every figure as JSON with
// the in-process store as the limit.
func TestBenchPluginSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts a plugin")
	}
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"bench", "plugin", "--batch", "4", "--rounds", "1", "--slab-dir", t.TempDir(), "--json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("bench plugin: %v\n%s", err, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 16 {
		t.Fatalf("want 16 JSON lines, got:\n%s", out.String())
	}
	for i, l := range lines {
		var r struct {
			Bench     string  `json:"bench"`
			Value     float64 `json:"value"`
			Limit     float64 `json:"limit"`
			LimitName string  `json:"limit_name"`
			Ratio     float64 `json:"ratio"`
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil || !strings.HasPrefix(r.Bench, "plugin/") || r.Value < 0 || (r.LimitName == "" && !strings.Contains(r.Bench, "ack-delay")) {
			t.Fatalf("line %d %q: %+v, %v", i, l, r, err)
		}
	}
	for _, bad := range [][]string{
		{"bench", "plugin", "--batch", "0"},
		{"bench", "plugin", "--rounds", "x"},
		{"bench", "plugin", "extra"},
	} {
		if err := run(context.Background(), bad, &out, &errOut); !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestBenchL3Small(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"bench", "l3", "--dir", t.TempDir(), "--pages", "6", "--page-bytes", "96KiB",
		"--batch", "4", "--depth", "2", "--rounds", "1", "--no-index-bench", "--json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("bench l3: %v\n%s", err, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) < 2 || len(lines) > 3 {
		t.Fatalf("want 2 JSON lines (3 with fio), got:\n%s", out.String())
	}
	for i, want := range []string{"l3/spill", "l3/reload"} {
		var r struct {
			Bench string  `json:"bench"`
			Value float64 `json:"value"`
			Unit  string  `json:"unit"`
		}
		if err := json.Unmarshal([]byte(lines[i]), &r); err != nil || r.Bench != want || r.Value <= 0 || r.Unit != "MiB/s" {
			t.Fatalf("line %d %q: %+v, %v", i, lines[i], r, err)
		}
	}
	for _, bad := range [][]string{
		{"bench", "l3", "--page-bytes", "lots"},
		{"bench", "l3", "extra"},
	} {
		if err := run(context.Background(), bad, &out, &errOut); !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}
}

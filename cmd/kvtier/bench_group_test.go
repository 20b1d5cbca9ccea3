package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestBenchGroupSmall(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"bench", "group", "--ranks", "3", "--ticks", "50", "--rounds", "1", "--json"}, &out, &errOut); err != nil {
		t.Fatalf("bench group: %v\n%s", err, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{"group/raw/p50", "group/tcp/p50", "group/raw/p99", "group/tcp/p99", "group/raw/cpu", "group/tcp/cpu"}
	if len(lines) != len(want) {
		t.Fatalf("want %d JSON lines, got:\n%s", len(want), out.String())
	}
	for i, w := range want {
		var r struct {
			Bench string  `json:"bench"`
			Value float64 `json:"value"`
			Unit  string  `json:"unit"`
			Ratio float64 `json:"ratio"`
		}
		if err := json.Unmarshal([]byte(lines[i]), &r); err != nil || r.Bench != w || r.Value <= 0 || !strings.HasSuffix(r.Unit, "us") && !strings.HasSuffix(r.Unit, "us/tick") {
			t.Fatalf("line %d %q: %+v, %v", i, lines[i], r, err)
		}
		if strings.HasPrefix(w, "group/tcp/") && r.Ratio <= 0 {
			t.Errorf("%s: no ratio", w)
		}
	}
	for _, bad := range [][]string{
		{"bench", "group", "--ranks", "1"},
		{"bench", "group", "--ranks", "1e6"},
		{"bench", "group", "--ticks", "0"},
		{"bench", "group", "extra"},
	} {
		if err := run(context.Background(), bad, &out, &errOut); !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}
}

package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestBenchHost runs `kvtier bench host --json` on a small trace: every
// row is named host/..., and the rows with a limit carry it and a ratio.
func TestBenchHost(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	dir := t.TempDir()
	trace := writeTrace(t, dir)
	out, _, err := runCLI(t, "bench", "host", "--json", "--trace", trace, "--rounds", "1", "--l3-pages", "2", "--dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r struct {
			Bench string
			Value float64
			Limit float64
			Ratio float64
			Note  string
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		seen[r.Bench] = true
		if !strings.HasPrefix(r.Bench, "host/") || r.Value <= 0 {
			t.Errorf("row %s", line)
		}
		if r.Bench == "host/decisions" || r.Bench == "host/decisions-tick-floor" || r.Bench == "host/l1-to-l2" {
			if r.Limit <= 0 || r.Ratio <= 0 {
				t.Errorf("row without its limit: %s", line)
			}
		}
	}
	for _, b := range []string{"host/decisions", "host/decisions-tick-floor", "host/l1-to-l2", "host/l2-to-l1", "host/spill", "host/reload"} {
		if !seen[b] {
			t.Errorf("no row %s in\n%s", b, out)
		}
	}
}

func TestBenchHostRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--rounds", "0"}, {"--l3-pages", "0"}, {"extra"}} {
		if _, _, err := runCLI(t, append([]string{"bench", "host"}, args...)...); err == nil || !errors.Is(err, errUsage) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}

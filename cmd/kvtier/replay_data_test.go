package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestReplayData runs `kvtier replay --data` on a small trace: JSON with
// every documented key and zero wrong bytes, and the table per tier.
func TestReplayData(t *testing.T) {
	dir := t.TempDir()
	trace := writeTrace(t, dir)
	out, _, err := runCLI(t, "replay", trace, "--data", "--json", "--data-dir", dir+"/stack")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, k := range []string{"mode", "policy", "geometry", "requests", "input_tokens", "hit_tokens", "hit_rate", "hit_tokens_by_tier", "verified_pages", "wrong_bytes", "skips", "bytes", "steps", "ticks", "seconds"} {
		if _, ok := got[k]; !ok {
			t.Errorf("no %q in %s", k, out)
		}
	}
	if got["mode"] != "data" || got["wrong_bytes"] != 0.0 || got["requests"] != 36.0 || got["hit_tokens"] == 0.0 || got["steps"] == 0.0 {
		t.Errorf("result %s", out)
	}
	by := got["bytes"].(map[string]any)
	for _, k := range []string{"l1_to_l2", "l2_to_l3", "l3_to_l2", "l2_to_l1"} {
		if _, ok := by[k]; !ok {
			t.Errorf("bytes has no %q: %s", k, out)
		}
	}
	out, _, err = runCLI(t, "replay", trace, "--data", "--requests", "10")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"10 of 36 requests", "geometry: kv 16KiB pages", "l1", "l3", "wrong bytes 0", " steps, "} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "map[") || !strings.Contains(out, "; failed ops ") {
		t.Errorf("skips and failed ops not printed as name=value lists:\n%s", out)
	}
}

// TestFormatCounts pins the text form of the counters by name that the
// data replay's table prints (skips, failed ops).
func TestFormatCounts(t *testing.T) {
	tests := []struct {
		in   map[string]int64
		want string
	}{
		{nil, "none"},
		{map[string]int64{}, "none"},
		{map[string]int64{"capacity": 1}, "capacity=1"},
		{map[string]int64{"ttl": 3, "capacity": 1, "exhausted": 0}, "capacity=1 exhausted=0 ttl=3"},
	}
	for _, tt := range tests {
		if got := formatCounts(tt.in); got != tt.want {
			t.Errorf("formatCounts(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestReplayDataRefusesFlags(t *testing.T) {
	dir := t.TempDir()
	trace := writeTrace(t, dir)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--policy", "lru"}, "--policy has no meaning with --data"},
		{[]string{"--capacity", "3M"}, "--capacity has no meaning with --data"},
		{[]string{"--cold-start", "warm"}, `--cold-start "warm"`},
		{[]string{"--requests", "-1"}, "requests"},
		{[]string{"--step-requests", "0"}, "--step-requests 0: must be at least 1"},
		{[]string{"--step-requests", "65537"}, "--step-requests 65537: at most 65536"},
	} {
		_, _, err := runCLI(t, append([]string{"replay", trace, "--data"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, errUsage) {
			t.Errorf("%v: %v, want a usage error containing %q", c.args, err, c.want)
		}
	}
	// The metadata replay has no engine steps.
	_, _, err := runCLI(t, "replay", trace, "--step-requests", "8")
	if err == nil || !strings.Contains(err.Error(), "--step-requests applies to --data") || !errors.Is(err, errUsage) {
		t.Errorf("--step-requests without --data: %v, want a usage error", err)
	}
}

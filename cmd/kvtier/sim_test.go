package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/host/simrun"
)

// TestSimNotes pins the text that explains sim's ticks and failed ops.
func TestSimNotes(t *testing.T) {
	ticks := []struct {
		ran, ticks uint64
		skew       int
		want       string
	}{
		{2000, 2000, 8, ""},
		{1500, 2000, 8, ""},
		{2050, 2000, 8, "; ticks past --ticks 2000: the last request ran to its end, then 48 ticks drained the held acks (4×(--max-ack-skew+4))"},
		{110, 100, 0, "; ticks past --ticks 100: the last request ran to its end, then 16 ticks drained the held acks (4×(--max-ack-skew+4))"},
	}
	for _, tt := range ticks {
		if got := simTicksNote(tt.ran, tt.ticks, tt.skew); got != tt.want {
			t.Errorf("simTicksNote(%d, %d, %d) = %q, want %q", tt.ran, tt.ticks, tt.skew, got, tt.want)
		}
	}
	failed := []struct {
		res  simrun.Result
		rate float64
		want string
	}{
		{simrun.Result{}, 0, "(none injected: --fail-rate 0; 0 failed by the tiers)"},
		{simrun.Result{FailedOps: 3}, 0, "(none injected: --fail-rate 0; 3 failed by the tiers)"},
		{simrun.Result{FailedOps: 110, InjectedFailedOps: 109}, 0.001, "(109 injected at --fail-rate 0.001, 1 failed by the tiers)"},
	}
	for _, tt := range failed {
		if got := simFailedOpsNote(tt.res, tt.rate); got != tt.want {
			t.Errorf("simFailedOpsNote(%+v, %g) = %q, want %q", tt.res, tt.rate, got, tt.want)
		}
	}
}

// TestSimCommand runs a small sim: without --fail-rate nothing is
// injected, the text explains the ticks past --ticks, and the JSON keys
// are the documented ones.
func TestSimCommand(t *testing.T) {
	out, _, err := runCLI(t, "sim", "--ranks", "2", "--ticks", "200")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ticks past --ticks 200: the last request ran to its end, then 48 ticks drained", "failed ops 0 (none injected: --fail-rate 0; 0 failed by the tiers)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out, _, err = runCLI(t, "sim", "--ranks", "2", "--ticks", "200", "--fail-rate", "0.01", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var keys []string
	for k := range got {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := []string{"digest_checks", "digest_every_ticks", "divergences", "evict_ahead", "failed_ops", "foreign_pages", "hangs",
		"l1_admissions", "l1_capacity_skips", "l1_plans", "l1_to_l2_bytes", "l2_to_l1_bytes", "l2_to_l3_bytes", "l3_to_l2_bytes",
		"max_ack_skew_ticks", "nodes", "owner_lanes", "ranks", "requests", "seconds", "seed", "ticks", "ticks_per_second", "verified_pages", "wrong_bytes"}
	if !slices.Equal(keys, want) {
		t.Errorf("json keys %q, want %q", keys, want)
	}
	if got["failed_ops"] == 0.0 {
		t.Errorf("--fail-rate 0.01 injected nothing: %s", out)
	}
	// Four ranks on two nodes: a Machine a node, the exchange between
	// them; a node count that does not divide the ranks is refused.
	out, _, err = runCLI(t, "sim", "--ranks", "4", "--nodes", "2", "--ticks", "200")
	if err != nil || !strings.Contains(out, "ranks 4 on 2 nodes") || !strings.Contains(out, "wrong bytes 0") {
		t.Errorf("--nodes 2: %v\n%s", err, out)
	}
	if _, _, err = runCLI(t, "sim", "--ranks", "4", "--nodes", "3"); err == nil || !strings.Contains(err.Error(), "--nodes 3") {
		t.Errorf("--nodes 3 of 4 ranks: %v", err)
	}
}

func TestParseSimFaults(t *testing.T) {
	for _, tc := range []struct {
		spec string
		n    int
		err  string
	}{
		{"", 0, ""},
		{"stall:2@100", 1, ""},
		{"stall:2@100, crash:0@5", 2, ""},
		{"stall:8@1", 0, "rank"},
		{"nap:1@1", 0, "kind"},
		{"stall:1", 0, "KIND:RANK@TICK"},
		{"crash:1@x", 0, "tick"},
	} {
		fs, err := parseSimFaults(tc.spec, 8)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want one naming %s", tc.spec, err, tc.err)
			}
			continue
		}
		if err != nil || len(fs) != tc.n {
			t.Errorf("%q: %v, %d faults, want %d", tc.spec, err, len(fs), tc.n)
		}
	}
}

func FuzzParseSimFaults(f *testing.F) {
	f.Add("stall:2@100,crash:1@5")
	f.Fuzz(func(t *testing.T, spec string) {
		fs, err := parseSimFaults(spec, 4)
		if err == nil {
			for _, x := range fs {
				if x.Rank < 0 || x.Rank >= 4 {
					t.Fatalf("%q: rank %d accepted", spec, x.Rank)
				}
			}
		}
	})
}

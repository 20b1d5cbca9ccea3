package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/host/config"
)

// writeTrace writes a small Mooncake-format trace of conversations that
// extend earlier turns, so hits, evictions and trims all happen at a few
// thousand tokens of capacity.
func writeTrace(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	next := 100
	for conv := range 12 {
		ids := []int{conv % 3}
		for turn := range 3 {
			for range 2 + (conv+turn)%4 {
				ids = append(ids, next)
				next++
			}
			js, _ := json.Marshal(ids)
			fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": 4, "hash_ids": %s}`+"\n",
				10*(3*conv+turn), 512*len(ids)-100, js)
		}
	}
	path := filepath.Join(dir, "trace.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func runCLI(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestReplayJSON(t *testing.T) {
	dir := t.TempDir()
	trace := writeTrace(t, dir)
	// Flags after TRACE work too.
	out, _, err := runCLI(t, "replay", trace, "--json", "--capacity", "4K,8192,inf", "--vs", "slru,lru")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	// Per finite capacity: adaptive (the default stack's policy), slru,
	// lru, belady; then infinite once.
	wantPolicies := []string{"adaptive", "slru", "lru", "belady", "adaptive", "slru", "lru", "belady", "infinite"}
	if len(lines) != len(wantPolicies) {
		t.Fatalf("got %d JSON lines, want %d:\n%s", len(lines), len(wantPolicies), out)
	}
	for i, l := range lines {
		var row map[string]any
		if err := json.Unmarshal([]byte(l), &row); err != nil {
			t.Fatalf("line %d: %v: %s", i+1, err, l)
		}
		for _, k := range []string{"policy", "capacity_tokens", "hit_rate", "hit_tokens", "input_tokens", "evictions", "nodes", "misses"} {
			if _, ok := row[k]; !ok {
				t.Errorf("line %d lacks key %q: %s", i+1, k, l)
			}
		}
		if row["policy"] != wantPolicies[i] {
			t.Errorf("line %d: policy %v, want %s", i+1, row["policy"], wantPolicies[i])
		}
		if hr := row["hit_rate"].(float64); hr < 0 || hr > 1 {
			t.Errorf("line %d: hit_rate %v is not a fraction", i+1, hr)
		}
	}
	var first, last map[string]any
	json.Unmarshal([]byte(lines[0]), &first)
	json.Unmarshal([]byte(lines[len(lines)-1]), &last)
	if first["capacity_tokens"].(float64) != 4000 || last["capacity_tokens"].(float64) != 0 {
		t.Errorf("capacities %v and %v, want 4000 and 0", first["capacity_tokens"], last["capacity_tokens"])
	}
	if first["evictions"].(float64) == 0 || last["evictions"].(float64) != 0 {
		t.Errorf("evictions: %v at 4K (want some), %v at inf (want 0)", first["evictions"], last["evictions"])
	}
}

// TestReplayLookahead: --lookahead N is in every JSON row; 0 prints what
// no flag prints, apart from that field; a lookahead changes the finite
// rows only.
func TestReplayLookahead(t *testing.T) {
	dir := t.TempDir()
	trace := writeTrace(t, dir)
	rows := func(args ...string) []map[string]any {
		t.Helper()
		out, _, err := runCLI(t, append([]string{"replay", trace, "--json", "--capacity", "8K,inf", "--policy", "lru"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		var rs []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			var r map[string]any
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatalf("%v: %s", err, l)
			}
			rs = append(rs, r)
		}
		if len(rs) != 3 {
			t.Fatalf("%v: got %d rows, want lru, belady, infinite", args, len(rs))
		}
		return rs
	}
	plain, zero, four := rows(), rows("--lookahead", "0"), rows("--lookahead", "4")
	for i := range plain {
		if plain[i]["lookahead"] != 0.0 || zero[i]["lookahead"] != 0.0 || four[i]["lookahead"] != 4.0 {
			t.Errorf("row %d: lookahead %v, %v, %v; want 0, 0, 4", i, plain[i]["lookahead"], zero[i]["lookahead"], four[i]["lookahead"])
		}
		if !reflect.DeepEqual(plain[i], zero[i]) {
			t.Errorf("row %d: --lookahead 0 differs from no flag:\n%v\n%v", i, zero[i], plain[i])
		}
	}
	// A conversation's first block (its system prompt) comes back every
	// third conversation: at 8K tokens lru evicts it in between, and
	// protecting the waiting turns keeps it (81408 hit tokens, not 76800).
	if four[0]["hit_tokens"].(float64) <= plain[0]["hit_tokens"].(float64) {
		t.Errorf("lru at 8K: %v hit tokens with --lookahead 4, %v without; want more", four[0]["hit_tokens"], plain[0]["hit_tokens"])
	}
	if four[2]["hit_tokens"] != plain[2]["hit_tokens"] {
		t.Errorf("infinite row: %v hit tokens with --lookahead 4, %v without", four[2]["hit_tokens"], plain[2]["hit_tokens"])
	}
}

func TestReplayTable(t *testing.T) {
	dir := t.TempDir()
	out, _, err := runCLI(t, "replay", "--policy", "sieve", "--capacity", "6K", writeTrace(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"36 requests", "POLICY", "HIT RATE", "NEVER SEEN", "EVICTED TAIL", "sieve", "belady", "infinite", "6K"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// TestReplayTableCapacityLabels: the table's CAPACITY column reads as a
// rounded label (at most two decimals), while --json keeps the integer.
func TestReplayTableCapacityLabels(t *testing.T) {
	dir := t.TempDir()
	trace := writeTrace(t, dir)
	tests := []struct {
		capacity string
		want     string
		notWant  string
	}{
		{"6K", " 6K ", ""},
		{"6144", " 6.14K ", "6.144K"},
		{"3000000", " 3M ", "3.00M"},
	}
	for _, tt := range tests {
		out, _, err := runCLI(t, "replay", "--policy", "lru", "--capacity", tt.capacity, trace)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, tt.want) || (tt.notWant != "" && strings.Contains(out, tt.notWant)) {
			t.Errorf("--capacity %s: table lacks %q (or has %q):\n%s", tt.capacity, tt.want, tt.notWant, out)
		}
	}
	out, _, err := runCLI(t, "replay", "--policy", "lru", "--capacity", "6144", "--json", trace)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `"capacity_tokens":6144`) {
		t.Errorf("json lost the exact capacity:\n%s", out)
	}
}

func TestReplaySweepWritesPlot(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "sweep") // --plot creates no directory
	out, errOut, err := runCLI(t, "replay", writeTrace(t, dir), "--sweep", "--sweep-points", "5", "--vs", "s3fifo", "--plot", prefix, "--json")
	if err != nil {
		t.Fatal(err)
	}
	for _, ext := range []string{".png", ".svg"} {
		st, err := os.Stat(prefix + ext)
		if err != nil || st.Size() < 1000 {
			t.Errorf("plot %s: %v (size %v)", prefix+ext, err, st)
		}
	}
	if !strings.Contains(errOut, "wrote "+prefix+".png") {
		t.Errorf("stderr does not name the plot: %q", errOut)
	}
	if n := strings.Count(out, "\n"); n < 3*3+1 {
		t.Errorf("sweep printed %d rows, want at least 10", n)
	}
}

func TestReplayErrors(t *testing.T) {
	dir := t.TempDir()
	trace := writeTrace(t, dir)
	bad := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(bad, []byte(`{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1]}`+"\n"+
		`{"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [1, "x"]}`+"\n"), 0o644)
	smallPages := filepath.Join(dir, "pages.yaml")
	os.WriteFile(smallPages, bytes.Replace(config.DefaultYAML(), []byte("page_tokens: 512"), []byte("page_tokens: 256"), 1), 0o644)
	for _, c := range []struct {
		name  string
		args  []string
		want  string
		usage bool
	}{
		{"malformed trace names the line", []string{bad}, bad + ":2:", false},
		{"missing trace", []string{filepath.Join(dir, "none.jsonl")}, "none.jsonl", false},
		{"unknown policy", []string{trace, "--policy", "nope"}, `policy "nope"`, false},
		{"bad capacity", []string{trace, "--capacity", "3X"}, `item 1 of "3X"`, true},
		{"two traces", []string{trace, trace}, "at most one TRACE", true},
		{"sweep and capacity", []string{trace, "--sweep", "--capacity", "1M"}, "exclude each other", true},
		{"infinite is not a policy", []string{trace, "--vs", "infinite"}, "infinite bound", false},
		{"page size must be the block size", []string{trace, "--config", smallPages}, "page_tokens is 256", false},
		{"bad flag", []string{"--nope"}, "unknown flag: --nope", true},
		{"negative lookahead", []string{trace, "--lookahead", "-1"}, "--lookahead -1", true},
		{"lookahead is not a data replay", []string{trace, "--data", "--lookahead", "4"}, "not to --data", true},
	} {
		_, _, err := runCLI(t, append([]string{"replay"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
			continue
		}
		if errors.Is(err, errUsage) != c.usage {
			t.Errorf("%s: usage error %t, want %t (%v)", c.name, errors.Is(err, errUsage), c.usage, err)
		}
	}
}

func TestBenchRadixJSON(t *testing.T) {
	dir := t.TempDir()
	out, _, err := runCLI(t, "bench", "radix", "--trace", writeTrace(t, dir), "--capacity", "4K", "--rounds", "1", "--min-round", "1ms", "--json")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2:\n%s", len(lines), out)
	}
	var vs map[string]any
	if err := json.Unmarshal([]byte(lines[1]), &vs); err != nil {
		t.Fatal(err)
	}
	if vs["bench"] != "radix/vs-naive-lru" || vs["unit"] != "block-ops/s" || vs["limit"].(float64) <= 0 || vs["ratio"].(float64) <= 0 {
		t.Errorf("comparison row %v", vs)
	}
	if _, _, err := runCLI(t, "bench", "radix", "--capacity", "inf"); err == nil || !errors.Is(err, errUsage) {
		t.Errorf("bench radix --capacity inf: %v, want a usage error", err)
	}
}

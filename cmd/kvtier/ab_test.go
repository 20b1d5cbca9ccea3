package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/internal/abstat"
)

// abExpo is a /metrics body of a serve whose live adaptive hits 30% and
// whose shadow slru hits 40% of n lookups of 1000 tokens.
func abExpo(n int) string {
	return fmt.Sprintf(`# TYPE kvtier_shadow_lookup_tokens_total counter
kvtier_shadow_lookup_tokens_total %d
# TYPE kvtier_shadow_hit_tokens_total counter
kvtier_shadow_hit_tokens_total{policy="adaptive",tier="l2"} %d
kvtier_shadow_hit_tokens_total{policy="slru",tier="l2"} %d
# TYPE kvtier_shadow_live_policy gauge
kvtier_shadow_live_policy{policy="adaptive"} 1
kvtier_shadow_live_policy{policy="slru"} 0
# TYPE kvtier_shadow_capacity_pages gauge
kvtier_shadow_capacity_pages{tier="l2"} 1024
`, 1000*n, 300*n+(n%3)*10, 400*n-(n%2)*10)
}

// TestABScrapesAndAnalyses scrapes a /metrics endpoint for a short window,
// saves the samples, and analyses them again with --from: both runs name
// slru the significant winner and agree to the digit.
func TestABScrapesAndAnalyses(t *testing.T) {
	var mu sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		n++
		body := abExpo(n)
		mu.Unlock()
		w.Write([]byte(body))
	}))
	defer srv.Close()
	save := filepath.Join(t.TempDir(), "ab.samples")
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"ab", "--metrics", srv.URL, "--window", "1s", "--interval", "100ms", "--save", save, "--json"}, &out, &errb); err != nil {
		t.Fatalf("ab: %v\n%s", err, errb.String())
	}
	var live abstat.Report
	if err := json.Unmarshal(out.Bytes(), &live); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if live.Buckets < 3 || len(live.Tiers) != 1 || live.Tiers[0].Winner != "slru" || !live.Tiers[0].Significant || live.Live != "adaptive" {
		t.Fatalf("report %+v", live)
	}
	out.Reset()
	if err := run(context.Background(), []string{"ab", "--from", save}, &out, &errb); err != nil {
		t.Fatalf("ab --from: %v", err)
	}
	text := out.String()
	for _, want := range []string{"live policy adaptive", "tier l2 (1024 pages)", "adaptive (live)", "verdict: slru wins: +10."} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
}

// TestABRefuses checks the command's bad inputs: each a clear error.
func TestABRefuses(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk")
	if err := os.WriteFile(junk, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, abstat.WriteScrape(nil, time.UnixMilli(1), []byte(abExpo(1))), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		msg  string
	}{
		{[]string{"ab"}, "name one of --metrics URL and --from FILE"},
		{[]string{"ab", "--from", junk}, "line 1: text before"},
		{[]string{"ab", "--from", short}, "1 scrapes"},
		{[]string{"ab", "--from", filepath.Join(dir, "none")}, "no such file"},
		{[]string{"ab", "--from", short, "--level", "2"}, "--level 2"},
		{[]string{"ab", "--metrics", "http://127.0.0.1:1/metrics", "--window", "300ms", "--interval", "100ms"}, "the first 3 scrapes failed"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			err := run(context.Background(), tc.args, &out, &errb)
			if err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %v, want %q", err, tc.msg)
			}
		})
	}
}

// benchRows reads a bench's --json output: its rows by name.
func benchRows(t *testing.T, out string) map[string]map[string]any {
	t.Helper()
	rows := map[string]map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		rows[r["bench"].(string)] = r
	}
	return rows
}

// TestBenchServeShadow runs one small round each way of bench serve
// --shadow against a serve subprocess and checks its rows.
func TestBenchServeShadow(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"bench", "serve", "--shadow", "lru,slru", "--rounds", "1", "--sessions", "1", "--requests", "300", "--l3", "none", "--copies=false", "--dir", t.TempDir(), "--json"}, &out, &errb); err != nil {
		t.Fatalf("bench serve --shadow: %v\n%s", err, errb.String())
	}
	rows := benchRows(t, out.String())
	for _, name := range []string{"serve/cpu_per_step_shadow", "serve/cpu_per_step_noshadow", "serve/shadow_cpu_ratio", "serve/shadow_busy_share"} {
		r := rows[name]
		if r == nil || r["value"].(float64) <= 0 {
			t.Errorf("row %s: %v", name, r)
		}
	}
	if r := rows["serve/shadow_busy_share"]; r != nil && (r["ratio"].(float64) <= 0 || r["ratio"].(float64) > 5) {
		t.Errorf("busy share %v", r["ratio"])
	}
}

// TestBenchServeSessions runs one small round of bench serve
// --cpu-sessions 1,2 against serve subprocesses and checks its rows: the
// steps' CPU of each count, the empty call's, and the floor built from
// them (the first count's step plus one empty call a further session).
func TestBenchServeSessions(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"bench", "serve", "--cpu-sessions", "1,2", "--rounds", "1", "--requests", "300", "--l3", "none", "--copies=false", "--dir", t.TempDir(), "--json"}, &out, &errb); err != nil {
		t.Fatalf("bench serve --cpu-sessions: %v\n%s", err, errb.String())
	}
	rows := benchRows(t, out.String())
	value := func(name string) float64 {
		r := rows[name]
		if r == nil || r["value"].(float64) <= 0 {
			t.Fatalf("row %s: %v (rows %v)", name, r, rows)
		}
		return r["value"].(float64)
	}
	base, call := value("serve/cpu_per_step_s1"), value("serve/cpu_per_call")
	value("serve/cpu_per_step_s2")
	value("serve/cpu_per_step_s2_machine_per_rank")
	if floor := value("serve/cpu_floor_s2"); math.Abs(floor-(base+call)) > 1e-6*floor {
		t.Errorf("floor %v, want the 1-session step %v plus one empty call %v", floor, base, call)
	}
	if r := rows["serve/cpu_floor_s2"]; math.Abs(r["ratio"].(float64)-base/r["value"].(float64)) > 1e-9 {
		t.Errorf("floor ratio %v, want %v", r["ratio"], base/r["value"].(float64))
	}
}

// TestBenchServeChildRefuses: a serve subprocess that exits before it
// listens (here: a shadow policy it does not know) ends the bench with
// serve's own error, at once. The bench used to wait forever: the exit was
// one value on a channel, taken by the wait for the socket and then waited
// for again by the stop.
func TestBenchServeChildRefuses(t *testing.T) {
	done := make(chan error, 1)
	var out, errb bytes.Buffer
	go func() {
		done <- run(context.Background(), []string{"bench", "serve", "--shadow", "nope", "--rounds", "1", "--sessions", "1", "--requests", "300", "--l3", "none", "--copies=false", "--dir", t.TempDir()}, &out, &errb)
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), `no eviction policy named "nope"`) {
			t.Fatalf("bench serve --shadow nope: %v, want serve's refusal of the policy", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("bench serve --shadow nope did not return within 40 s of serve's refusal")
	}
}

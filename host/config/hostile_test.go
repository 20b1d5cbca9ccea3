package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const hostileHead = "version: 1\nmodel:\n  page_tokens: 16\n  payloads: [{name: kv, page_bytes: 1000}]\n"

// keys returns n lines "PREFIXi: 1" indented by indent.
func keys(indent, prefix string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%s%s%d: 1\n", indent, prefix, i)
	}
	return b.String()
}

// nestedBlockMaps returns n block mappings each inside the last.
func nestedBlockMaps(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%sa:\n", strings.Repeat(" ", i))
	}
	return b.String()
}

// TestHostileShapes feeds configs built to make the YAML parser slow or
// hungry (deep nesting, huge mappings, many tokens or documents, nested
// aliases, oversized input): each is refused before the parser builds a
// tree, with the limit in the message and the line and column where the
// input crosses it.
func TestHostileShapes(t *testing.T) {
	m := testModules()
	tests := []struct {
		name       string
		yaml       string
		want       string
		line, col  int // 0: not checked
		pathPrefix string
	}{
		{name: "200 KB of nested flow lists", yaml: "version: 1\nmodel: " + strings.Repeat("[", 200<<10) + "\n",
			want: "nest deeper than 64 levels", line: 2, col: 8 + 63}, // the root mapping is level 1
		{name: "nested flow maps", yaml: "version: 1\nmodel: " + strings.Repeat("{a: ", 50<<10) + "\n",
			want: "nest deeper than 64 levels", line: 2, col: 8 + 4*63},
		{name: "nested block maps", yaml: hostileHead + nestedBlockMaps(100),
			want: "nest deeper than 64 levels", line: 5 + 64, col: 65},
		{name: "nested block sequences", yaml: hostileHead + "x: " + strings.Repeat("- ", 100) + "1\n",
			want: "nest deeper than 64 levels", line: 5, col: 4 + 2*63},
		{name: "flow inside block counts both", yaml: hostileHead + nestedBlockMaps(40) + strings.Repeat(" ", 40) + "b: " + strings.Repeat("[", 40) + "\n",
			want: "nest deeper than 64 levels", line: 5 + 40},
		{name: "1001 keys in one mapping", yaml: hostileHead + "tiers: []\nx:\n" + keys("  ", "k", 1001),
			want: `key "k1000" is key number 1001 of one mapping; a mapping may hold at most 1000`, line: 7 + 1000, col: 3},
		{name: "1001 top-level keys", yaml: hostileHead + keys("", "k", 1000),
			want: `key "k998" is key number 1001`, line: 5 + 998},
		{name: "20k unknown keys", yaml: hostileHead + keys("", "k", 20000),
			want: "is key number 1001", line: 5 + 998},
		{name: "100k unknown keys", yaml: hostileHead + keys("", "k", 100000)[:MaxConfigBytes-200],
			want: "is key number 1001", line: 5 + 998},
		{name: "20k list items", yaml: hostileHead + "x: [" + strings.Repeat("1, ", 20000) + "1]\n",
			want: "more than 20000 YAML tokens", line: 5},
		{name: "many documents", yaml: strings.Repeat("---\n", 17) + hostileHead,
			want: "more than 16 document markers", line: 17, col: 1},
		{name: "nested aliases", yaml: hostileHead + "tiers: []\nx:\n  a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + func() string {
			var b strings.Builder
			for i := 1; i < 12; i++ {
				fmt.Fprintf(&b, "  a%d: &a%d [%s]\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*a%d, ", i-1), 10), ", "))
			}
			return b.String()
		}(), want: "aliases expand the config to more than 100000 values"},
		{name: "over the size cap", yaml: hostileHead + "# " + strings.Repeat("x", MaxConfigBytes) + "\n",
			want: "more than the 256KiB a stack config may hold"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]byte(tc.yaml), "h.yaml", m)
			var ce *Error
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalid) || !strings.Contains(ce.Msg, tc.want) {
				t.Fatalf("got %.300v; want an *Error saying %q", err, tc.want)
			}
			if tc.line > 0 && ce.Line != tc.line {
				t.Errorf("line %d, want %d: %.300v", ce.Line, tc.line, err)
			}
			if tc.col > 0 && ce.Column != tc.col {
				t.Errorf("column %d, want %d: %.300v", ce.Column, tc.col, err)
			}
			if n := len(err.Error()); n > 4096 {
				t.Errorf("error message is %d bytes", n)
			}
		})
	}
}

// TestShapeWithinLimits checks that the shape limits leave room: nesting
// and mappings just inside them reach the ordinary checks.
func TestShapeWithinLimits(t *testing.T) {
	m := testModules()
	for _, tc := range []struct{ name, yaml, want string }{
		{"60 nested flow lists", hostileHead + "x: " + strings.Repeat("[", 60) + strings.Repeat("]", 60) + "\n", `unknown field "x"`},
		{"60 nested block maps", hostileHead + nestedBlockMaps(60) + strings.Repeat(" ", 60) + "b: 1\n", `unknown field "a"`},
		{"1000 keys", hostileHead + "tiers: []\nx:\n" + keys("  ", "k", 1000), `unknown field "x"`},
		{"sequence entries at the key's column", hostileHead + "tiers:\n- {name: l2, role: slab, use: testslab}\n- {name: l3, role: store, use: teststore}\npolicy: {evictor: lru}\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]byte(tc.yaml), "ok.yaml", m)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("got %v, want no error", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %.300v; want %q", err, tc.want)
			}
		})
	}
}

// TestUnknownFieldFirstInFileOrder checks that of many unknown keys the
// error names the first in the file, on every run, at every level.
func TestUnknownFieldFirstInFileOrder(t *testing.T) {
	m := testModules()
	for _, tc := range []struct {
		name, yaml, want, path string
		line                   int
	}{
		{"top level", hostileHead + keys("", "zz", 500), `unknown field "zz0"`, "$.zz0", 5},
		{"after known keys", hostileHead + "tiers: []\nbogus: 1\n" + keys("", "zz", 300), `unknown field "bogus"`, "$.bogus", 6},
		{"nested", hostileHead + "policy:\n  evictor: lru\n" + keys("  ", "p", 300), `unknown field "p0"`, "$.policy.p0", 7},
		{"in a list", "version: 1\nmodel:\n  page_tokens: 16\n  payloads:\n    - {name: kv, page_bytes: 1000, b: 1, a: 2, c: 3}\n", `unknown field "b"`, "$.model.payloads[0].b", 5},
		{"module config", hostileHead + "tiers:\n  - name: l2\n    role: slab\n    use: testslab\n    config:\n      size: 1GiB\n" + keys("      ", "q", 300), `unknown field "q0"`, "$.tiers[0].config.q0", 11},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for run := range 5 {
				_, err := Load([]byte(tc.yaml), "u.yaml", m)
				var ce *Error
				if !errors.As(err, &ce) || !strings.Contains(ce.Msg, tc.want) || ce.Path != tc.path || ce.Line != tc.line {
					t.Fatalf("run %d: got %.300v; want %s at %s, line %d", run, err, tc.want, tc.path, tc.line)
				}
			}
		})
	}
}

// TestLoadFileCap checks that LoadFile reads no more than MaxConfigBytes
// of any file, a device without end included.
func TestLoadFileCap(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, []byte(hostileHead+"#"+strings.Repeat("x", MaxConfigBytes)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	exact := filepath.Join(dir, "exact.yaml")
	if err := os.WriteFile(exact, []byte(hostileHead+"#"+strings.Repeat("x", MaxConfigBytes-len(hostileHead)-2)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	paths := []string{big}
	if _, err := os.Stat("/dev/zero"); err == nil {
		paths = append(paths, "/dev/zero")
	}
	for _, p := range paths {
		_, err := LoadFile(p, testModules())
		var ce *Error
		if !errors.As(err, &ce) || ce.File != p || !strings.Contains(err.Error(), "larger than the 256KiB a stack config may hold") {
			t.Errorf("LoadFile(%s): %.300v; want a refusal naming the file and the cap", p, err)
		}
	}
	if _, err := LoadFile(exact, testModules()); err != nil {
		t.Errorf("a config of exactly %d bytes: %v", MaxConfigBytes, err)
	}
}

// TestByteOrderMark checks that a leading UTF-8 BOM is ignored.
func TestByteOrderMark(t *testing.T) {
	for _, src := range []string{
		"\uFEFF# a comment first\n" + hostileHead,
		"\uFEFF" + hostileHead,
	} {
		if _, err := Load([]byte(src), "bom.yaml", testModules()); err != nil {
			t.Errorf("%q: %v", src[:20], err)
		}
	}
}

// TestErrorsQuoteAndClip checks that an error never copies control or
// terminal-escape bytes from the config and stays short however long the
// offending value.
func TestErrorsQuoteAndClip(t *testing.T) {
	long := strings.Repeat("x", 200<<10)
	for _, tc := range []struct {
		name, yaml string
		want       string
	}{
		{"escape in a key", hostileHead + "x\x1b[31m: 1\n", `unknown field "x\x1b[31m"`},
		{"escape in a value", hostileHead + "write_policy: \"\x1b]0;pwned\x07\"\n", `"\x1b]0;pwned\a"`},
		{"long value", hostileHead + "write_policy: " + long + "\n", `… (204800 bytes)`},
		{"long key", hostileHead + long + ": 1\n", "unknown field"},
		{"long size", hostileHead + "tiers:\n  - {name: l2, role: slab, use: testslab, config: {size: " + long + "}}\n", "too long for a size"},
		{"NUL and bidi", hostileHead + "tiers:\n  - {name: \"a\\0b\\u202e\", role: slab, use: testslab}\n", `\x00b\u202e`},
		{"long line", hostileHead + "tiers: [" + strings.Repeat("1, ", 20000) + "{}]\n", "^"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]byte(tc.yaml), "q.yaml", testModules())
			if err == nil {
				t.Fatal("accepted")
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) {
				t.Errorf("message lacks %q:\n%.600s", tc.want, msg)
			}
			if len(msg) > 4096 {
				t.Errorf("message is %d bytes:\n%.600s", len(msg), msg)
			}
			for i, r := range msg {
				if (r < 0x20 && r != '\n' && r != '\t') || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\u202e' {
					t.Fatalf("message holds %U at byte %d:\n%q", r, i, msg)
				}
			}
		})
	}
}

// TestLoadLinearInKeys checks that loading grows linearly with the number
// of keys once no mapping is larger than a bound: four times the keys (in
// four times the mappings of 100 keys, inside a plugin's config, which is
// decoded and re-encoded whole) must cost well under the sixteen times a
// quadratic loader would. The best of nine alternating runs of each size is compared,
// as a ratio, so a slow machine does not fail it.
func TestLoadLinearInKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("timing test")
	}
	build := func(mappings int) []byte {
		var b strings.Builder
		b.WriteString(hostileHead + "tiers:\n  - {name: l2, role: slab, use: testslab}\n  - name: r\n    role: store\n    plugin:\n      path: /p\n      sha256: " + strings.Repeat("a", 64) + "\n      config:\n")
		for i := range mappings {
			fmt.Fprintf(&b, "        m%d:\n%s", i, keys("          ", "k", 100))
		}
		return []byte(b.String())
	}
	// NB: the sizes alternate, and each keeps its best of nine runs, so a
	// burst of load on a shared machine lands on both sides alike instead
	// of on one size's runs only (13.1x was seen with five runs each, one
	// size after the other, on a loaded 2-core machine).
	once := func(data []byte) time.Duration {
		start := time.Now()
		if _, err := Load(data, "lin.yaml", testModules()); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	smallData, largeData := build(10), build(40)
	small, large := time.Duration(1<<62), time.Duration(1<<62)
	for range 9 {
		small = min(small, once(smallData))
		large = min(large, once(largeData))
	}
	t.Logf("1000 keys: %v, 4000 keys: %v (ratio %.1f)", small, large, float64(large)/float64(small))
	if ratio := float64(large) / float64(small); ratio > 10 {
		t.Errorf("1000 keys load in %v, 4000 in %v: ratio %.1f, want about 4 (linear), not 16", small, large, ratio)
	}
}

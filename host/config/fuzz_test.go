package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// FuzzLoad feeds arbitrary bytes to the loader with the test modules. It
// must never panic; every failure must be an *Error wrapping ErrInvalid
// whose line, when set, exists in the input; and every stack it accepts
// must print (String) to YAML that loads back to an equal stack.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(validFull))
	f.Add(DefaultYAML())
	f.Add([]byte("version: 1\nmodel: {page_tokens: 16, payloads: [{name: kv, page_bytes: 1000}]}\n"))
	f.Add([]byte("version: 1\nmodel: {page_tokens: 512, payloads: [{name: kv, page_bytes: 2MiB}]}\ntiers:\n  - {name: l2, role: slab, use: testslab, config: {size: 1GiB}}\n  - {name: l3, role: store, use: teststore, index: {use: testindex}}\n"))
	f.Add([]byte("version: 1\nmodel: &m {page_tokens: 512}\nx: *m\n"))
	f.Add([]byte("version: 1\n---\nversion: 2\n"))
	f.Add([]byte("{version: [1, {a: b}], model: null}"))
	f.Add([]byte("version: 1\nmodel:\n\tpage_tokens: 5\n"))
	// Hostile shapes (the limits of limits.go) and hostile text.
	f.Add([]byte("version: 1\nmodel: " + strings.Repeat("[", 100) + "\n"))
	f.Add([]byte("version: 1\nmodel: " + strings.Repeat("{a: ", 70) + "\n"))
	f.Add([]byte("x: " + strings.Repeat("- ", 70) + "1\n"))
	f.Add([]byte(hostileHead + "tiers: []\nx:\n" + keys("  ", "k", 1001)))
	f.Add([]byte(strings.Repeat("---\n", 17)))
	f.Add([]byte(hostileHead + "a0: &a [1, 1, 1, 1]\na1: &b [*a, *a, *a, *a]\na2: &c [*b, *b, *b, *b]\n"))
	f.Add([]byte("\uFEFF# bom\n" + hostileHead))
	f.Add([]byte(hostileHead + "write_policy: \"\x1b]0;t\x07\"\nx\x1b[31m: 1\n"))
	f.Add([]byte(hostileHead + "tiers:\n  - {name: \"a\\0b\", role: slab, use: testslab, config: {size: 1e3}}\n"))
	m := testModules()
	f.Fuzz(func(t *testing.T, data []byte) {
		start := time.Now()
		s, err := Load(data, "fuzz.yaml", m)
		// NB: the input limits bound the work; a generous wall-clock bound
		// catches a shape that escapes them, not a slow machine.
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("Load took %v on %d bytes", d, len(data))
		}
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("error is %T, not an *Error wrapping ErrInvalid: %v", err, err)
			}
			if lines := strings.Count(string(data), "\n") + 1; ce.Line < 0 || ce.Line > lines {
				t.Fatalf("error names line %d of %d: %v", ce.Line, lines, err)
			}
			msg := err.Error()
			if len(msg) > 8192 {
				t.Fatalf("error message of %d bytes", len(msg))
			}
			for _, r := range msg {
				if (r < 0x20 && r != '\n' && r != '\t') || r == 0x7f || (r >= 0x80 && r < 0xa0) {
					t.Fatalf("error message holds %U: %q", r, msg)
				}
			}
			return
		}
		out := s.String()
		s2, err := Load([]byte(out), "fuzz.out.yaml", m)
		if err != nil {
			t.Fatalf("accepted stack prints YAML that does not load:\n%s\nerror: %v", out, err)
		}
		if !equalStacks(s, s2) {
			t.Fatalf("round trip changed the stack:\n%+v\n%+v\nYAML:\n%s", s, s2, out)
		}
	})
}

package config

import (
	"errors"
	"strings"
	"testing"
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
	m := testModules()
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Load(data, "fuzz.yaml", m)
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("error is %T, not an *Error wrapping ErrInvalid: %v", err, err)
			}
			if lines := strings.Count(string(data), "\n") + 1; ce.Line < 0 || ce.Line > lines {
				t.Fatalf("error names line %d of %d: %v", ce.Line, lines, err)
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

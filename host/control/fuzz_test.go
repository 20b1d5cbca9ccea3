package control

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzEvents decodes arbitrary text as event lines and applies what
// decodes to a Machine ("tick" lines tick it over a group of one). It
// asserts no panic, that a refused event leaves the digest unchanged, that
// a local event never changes it, and that decoding is bounded.
func FuzzEvents(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.txt")
	for _, p := range files {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		var lines []string
		for _, l := range strings.Split(string(data), "\n") {
			if e, err := ParseEvent(l); err == nil || strings.HasPrefix(l, "tick") {
				_ = e
				lines = append(lines, l)
			}
		}
		f.Add(strings.Join(lines, "\n"))
	}
	f.Add("insert req=1 pages=2 hashes=a,b\ndone op=1 stage=copied ok\ntick\nmatch req=2 hashes=a,x\nlongest op=3 pages=1\ntick")
	f.Add("extend req=1 node=0 hashes=a\nrelease req=1\nflush\ntier tier=3 down\ntick")
	f.Fuzz(func(t *testing.T, data string) {
		m := testMachine(t)
		lines := strings.Split(data, "\n")
		if len(lines) > 200 {
			lines = lines[:200]
		}
		for _, l := range lines {
			if strings.TrimSpace(l) == "tick" {
				f, err := Reduce(m.Contribution())
				if err != nil {
					t.Fatalf("reduce own contribution: %v", err)
				}
				if err := m.Tick(f); err != nil {
					t.Fatalf("tick own frontier: %v", err)
				}
				m.Advance()
				continue
			}
			e, err := ParseEvent(l)
			if err != nil {
				continue
			}
			before := m.Digest()
			err = m.Apply(e)
			m.Advance()
			if err != nil {
				var ee *EventError
				if !errors.As(err, &ee) {
					t.Fatalf("%q: refused without an *EventError: %v", l, err)
				}
				if m.Digest() != before {
					t.Fatalf("%q: refused event changed the digest: %v", l, err)
				}
				continue
			}
			if !e.Kind.Replicated() && m.Digest() != before {
				t.Fatalf("%q: local event changed the replicated digest", l)
			}
		}
		if err := m.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzParseNames: ParseWritePolicy and ParseStage accept exactly the
// names String writes, and name the input and the choices otherwise.
func FuzzParseNames(f *testing.F) {
	for _, s := range []string{"write_through", "write_back", "copied", "found", "", "stage(0)", "Copied", "durable "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if p, err := ParseWritePolicy(s); err == nil {
			if p.String() != s {
				t.Fatalf("ParseWritePolicy(%q) = %v, which prints %q", s, p, p.String())
			}
		} else if !strings.Contains(err.Error(), "write policy") {
			t.Fatalf("ParseWritePolicy(%q): %v", s, err)
		}
		if st, err := ParseStage(s); err == nil {
			if st.String() != s || st == 0 {
				t.Fatalf("ParseStage(%q) = %v, which prints %q", s, st, st.String())
			}
		} else if !strings.Contains(err.Error(), "stage") {
			t.Fatalf("ParseStage(%q): %v", s, err)
		}
	})
}

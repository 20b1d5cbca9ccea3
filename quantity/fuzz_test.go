package quantity

import (
	"errors"
	"testing"
)

// FuzzParseSize checks that every size ParseSize accepts prints and parses
// back to itself.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"2.75MiB", "64GiB", "1.5GB", "4096", "0.1KiB", "-1", "1e3", "1.2.3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseSize(s)
		if err != nil {
			if !errors.Is(err, ErrBadQuantity) {
				t.Fatalf("error %v does not match ErrBadQuantity", err)
			}
			return
		}
		if v < 0 {
			t.Fatalf("ParseSize(%q) = %d < 0", s, v)
		}
		back, err := ParseSize(v.String())
		if err != nil || back != v {
			t.Fatalf("ParseSize(%q) = %d; String %q parses to %d, %v", s, v, v.String(), back, err)
		}
		tok, err := ParseTokens(s)
		if err == nil && !tok.IsInf() {
			if back, err := ParseTokens(tok.String()); err != nil || back != tok {
				t.Fatalf("ParseTokens(%q) = %d; String %q parses to %d, %v", s, tok, tok.String(), back, err)
			}
		}
	})
}

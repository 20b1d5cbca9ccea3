package quantity

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
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

// FuzzParseTokenList checks that a list ParseTokenList accepts holds only
// counts that print and parse back, and that every refusal is an
// ErrBadQuantity error of bounded length.
func FuzzParseTokenList(f *testing.F) {
	for _, s := range []string{"1M,3M,10M,inf", "1M,,3M", "4096", "1.5M, 2K", "-1", strings.Repeat("1,", 2000)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		list, err := ParseTokenList(s)
		if err != nil {
			if !errors.Is(err, ErrBadQuantity) {
				t.Fatalf("error %v does not match ErrBadQuantity", err)
			}
			if len(err.Error()) > 1024 {
				t.Fatalf("error of %d bytes", len(err.Error()))
			}
			return
		}
		for _, tok := range list {
			if tok < 0 {
				t.Fatalf("ParseTokenList(%q) holds %d", s, tok)
			}
			if back, err := ParseTokens(tok.String()); err != nil || back != tok {
				t.Fatalf("ParseTokenList(%q) holds %d; String %q parses to %d, %v", s, tok, tok.String(), back, err)
			}
		}
	})
}

// FuzzQuote checks that Quote and Clip never let a control byte, a C1
// control or invalid UTF-8 through, and stay bounded.
func FuzzQuote(f *testing.F) {
	for _, s := range []string{"64GiB", "a\x1b[31mb", "\xff\xfe", "\u202e", strings.Repeat("é", 50), "\"\\"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, out := range []string{Quote(s), Clip(s, 64)} {
			if !utf8.ValidString(out) {
				t.Fatalf("invalid UTF-8 out of %q: %q", s, out)
			}
			if len(out) > 64*10+32 {
				t.Fatalf("%d bytes out of %d", len(out), len(s))
			}
			for _, r := range out {
				if (r < 0x20 && r != '\t') || r == 0x7f || (r >= 0x80 && r < 0xa0) {
					t.Fatalf("%U out of %q: %q", r, s, out)
				}
			}
		}
	})
}

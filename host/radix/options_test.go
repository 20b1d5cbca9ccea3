package radix

import (
	"strings"
	"testing"
)

func TestParseOptions(t *testing.T) {
	for _, c := range []struct {
		in      string
		want    Options
		wantErr string
	}{
		{in: "", want: DefaultOptions()},
		{in: "page_tokens=2 tiers=3 residency=L1", want: Options{PageTokens: 2, Tiers: 3, Residency: L1}},
		{in: "residency=L1+L2 tiers=2", want: Options{PageTokens: 512, Tiers: 2, Residency: L1 | L2}},
		{in: "tiers=8 residency=L8", want: Options{PageTokens: 512, Tiers: 8, Residency: 1 << 7}},
		{in: "page_tokens=0", wantErr: "page_tokens must be positive"},
		{in: "tiers=9", wantErr: "tiers must be in 1..8"},
		{in: "tiers=2 residency=L3", wantErr: "beyond the 2 configured"},
		{in: "residency=-", wantErr: "at least one tier"},
		{in: "residency=L0", wantErr: `got "L0"`},
		{in: "residency=X1", wantErr: `got "X1"`},
		{in: "tiers=2 tiers=3", wantErr: "tiers given twice"},
		{in: "pages=3", wantErr: `unknown key "pages"`},
		{in: "tiers", wantErr: "is not key=value"},
		{in: "tiers=x", wantErr: "tiers: strconv.Atoi"},
	} {
		got, err := ParseOptions(c.in)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("ParseOptions(%q): error %v, want one containing %q", c.in, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseOptions(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
		if back, err := ParseOptions(got.String()); err != nil || back != got {
			t.Errorf("%v does not round-trip: %v, %v", got, back, err)
		}
	}
}

// FuzzParseOptions: the parser never panics and what it accepts is valid
// and round-trips through String.
func FuzzParseOptions(f *testing.F) {
	for _, s := range []string{"", "page_tokens=512 tiers=3 residency=L1", "residency=L1+L2+L3", "tiers=1", "residency=L", "x=y", "tiers=-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o, err := ParseOptions(s)
		if err != nil {
			return
		}
		if err := o.Validate(); err != nil {
			t.Fatalf("ParseOptions(%q) accepted invalid %v: %v", s, o, err)
		}
		back, err := ParseOptions(o.String())
		if err != nil || back != o {
			t.Fatalf("%v does not round-trip: %v, %v", o, back, err)
		}
	})
}

// FuzzParseResidency: what parses prints back to a string that parses to
// the same set; what does not gets an error naming the input.
func FuzzParseResidency(f *testing.F) {
	for _, s := range []string{"-", "L1", "L1+L2+L3", "L8", "L9", "L0", "l1", "L1+", "+", "", "L1+L1", "L01"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseResidency(s)
		if err != nil {
			if !strings.Contains(err.Error(), "residency") {
				t.Fatalf("ParseResidency(%q): error %q does not name what", s, err)
			}
			return
		}
		back, err := ParseResidency(r.String())
		if err != nil || back != r {
			t.Fatalf("ParseResidency(%q) = %v, which prints %q and parses back to %v, %v", s, r, r.String(), back, err)
		}
	})
}

package quantity

import (
	"errors"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want Size
		err  string
	}{
		{in: "0", want: 0},
		{in: "4096", want: 4096},
		{in: "64GiB", want: 64 << 30},
		{in: "2MiB", want: 2 << 20},
		{in: "2.75MiB", want: 2883584},
		{in: "1.5GB", want: 1500000000},
		{in: "1.5 GB", want: 1500000000},
		{in: " 16kib ", want: 16384},
		{in: "1TiB", want: 1 << 40},
		{in: "7B", want: 7},
		{in: "0.5KiB", want: 512},
		{in: "-1MiB", err: "must not be negative"},
		{in: "0.1KiB", err: "not a whole number"},
		{in: "2M", err: `unknown unit "M"`},
		{in: "2 gigs", err: `unknown unit "gigs"`},
		{in: "", err: "want a number"},
		{in: "MiB", err: "want a number"},
		{in: ".5MiB", err: "want a number"},
		{in: "5.MiB", err: "want a number"},
		{in: "1.2.3MiB", err: "unknown unit"},
		{in: "9999999TiB", err: "too large"},
		{in: "9223372036854775808", err: "too large"},
		{in: "1e3", err: "exponent notation"},
		{in: "1E3KiB", err: "exponent notation"},
		{in: "64gib", want: 64 << 30},
		{in: strings.Repeat("1", 65), err: "too long"},
	}
	for _, tc := range tests {
		got, err := ParseSize(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrBadQuantity) {
				t.Errorf("ParseSize(%q) = %d, %v; want an ErrBadQuantity error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestSizeString(t *testing.T) {
	for _, tc := range []struct {
		in   Size
		want string
	}{
		{0, "0"}, {1000, "1KB"}, {1023, "1023"}, {1001, "1001"}, {1010, "1.01KB"}, {1536, "1.5KiB"}, {4096, "4KiB"},
		{2883584, "2.75MiB"}, {1500000000, "1.5GB"}, {64 << 30, "64GiB"}, {1 << 40, "1TiB"},
		{1<<40 + 1, "1099511627777"},
	} {
		if got := tc.in.String(); got != tc.want {
			t.Errorf("Size(%d).String() = %q, want %q", int64(tc.in), got, tc.want)
		}
		back, err := ParseSize(tc.in.String())
		if err != nil || back != tc.in {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in.String(), back, err, tc.in)
		}
	}
}

func TestSizeYAML(t *testing.T) {
	type doc struct {
		A Size `yaml:"a"`
	}
	for _, tc := range []struct {
		in   string
		want Size
		err  string
	}{
		{in: "a: 4096", want: 4096},
		{in: "a: 2.75MiB", want: 2883584},
		{in: `a: "64GiB"`, want: 64 << 30},
		{in: "a: 1.5", err: "want a size"},
		{in: "a: [1]", err: "want a size"},
		{in: "a: true", err: "want a size"},
		{in: "a: -5", err: "must not be negative"},
	} {
		var d doc
		err := yaml.UnmarshalWithOptions([]byte(tc.in), &d, yaml.Strict())
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: got %d, %v; want error containing %q", tc.in, d.A, err, tc.err)
			}
			continue
		}
		if err != nil || d.A != tc.want {
			t.Errorf("%q: got %d, %v; want %d", tc.in, d.A, err, tc.want)
		}
		out, err := yaml.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		var back doc
		if err := yaml.Unmarshal(out, &back); err != nil || back != d {
			t.Errorf("round trip of %q via %q: %d, %v", tc.in, out, back.A, err)
		}
	}
}

func TestParseTokens(t *testing.T) {
	tests := []struct {
		in   string
		want Tokens
		err  string
	}{
		{in: "1M", want: 1000000},
		{in: "3M", want: 3000000},
		{in: "10M", want: 10000000},
		{in: "1.5M", want: 1500000},
		{in: "512", want: 512},
		{in: "64k", want: 64000},
		{in: "2G", want: 2000000000},
		{in: "inf", want: InfiniteTokens},
		{in: "INF", want: InfiniteTokens},
		{in: "-1M", err: "must not be negative"},
		{in: "1MiB", err: `unknown suffix "MiB"`},
		{in: "1.0000001K", err: "not a whole number"},
		{in: "x", err: "want a number"},
		{in: "", err: "want a number"},
		{in: "9223372036854775807", err: "too large"},
	}
	for _, tc := range tests {
		got, err := ParseTokens(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrBadQuantity) {
				t.Errorf("ParseTokens(%q) = %d, %v; want an ErrBadQuantity error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseTokens(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
		if back, err := ParseTokens(got.String()); err != nil || back != got {
			t.Errorf("ParseTokens(%q.String() = %q) = %d, %v", tc.in, got.String(), back, err)
		}
	}
	// Capacity in blocks is floor(tokens / 512): 3M tokens is 5,859 blocks.
	if c, _ := ParseTokens("3M"); int64(c)/512 != 5859 {
		t.Errorf("3M tokens = %d blocks, want 5859", int64(c)/512)
	}
}

// TestTokensHuman pins the rounded labels of tables and plots.
func TestTokensHuman(t *testing.T) {
	tests := []struct {
		in   Tokens
		want string
	}{
		{0, "0"},
		{512, "512"},
		{999, "999"},
		{1000, "1K"},
		{6144, "6.14K"},
		{6500, "6.5K"},
		{999_996, "1M"},
		{3_000_000, "3M"},
		{121_965_056, "121.97M"},
		{1_500_000_000, "1.5G"},
		{2_000_000_000_000, "2000G"},
		{InfiniteTokens, "inf"},
	}
	for _, tt := range tests {
		if got := tt.in.Human(); got != tt.want {
			t.Errorf("Tokens(%d).Human() = %q, want %q", int64(tt.in), got, tt.want)
		}
	}
}

func TestParseTokenList(t *testing.T) {
	got, err := ParseTokenList("1M,3M, 10M,inf")
	if err != nil {
		t.Fatal(err)
	}
	want := []Tokens{1000000, 3000000, 10000000, InfiniteTokens}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	for _, bad := range []string{"", "1M,,3M", "1M,x"} {
		_, err := ParseTokenList(bad)
		if err == nil || !errors.Is(err, ErrBadQuantity) {
			t.Errorf("ParseTokenList(%q): got %v, want an ErrBadQuantity error", bad, err)
		}
	}
	if _, err := ParseTokenList("1M,x"); err == nil || !strings.Contains(err.Error(), "item 2") {
		t.Errorf("error %v does not name the item", err)
	}
}

func TestTokensYAML(t *testing.T) {
	type doc struct {
		C []Tokens `yaml:"c"`
	}
	var d doc
	if err := yaml.UnmarshalWithOptions([]byte("c: [1M, 4096, .inf, inf, 2.5K]"), &d, yaml.Strict()); err != nil {
		t.Fatal(err)
	}
	want := []Tokens{1000000, 4096, InfiniteTokens, InfiniteTokens, 2500}
	for i := range want {
		if d.C[i] != want[i] {
			t.Fatalf("got %v, want %v", d.C, want)
		}
	}
	out, err := yaml.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	var back doc
	if err := yaml.Unmarshal(out, &back); err != nil || len(back.C) != len(d.C) {
		t.Fatalf("round trip via %q: %v, %v", out, back, err)
	}
	for i := range d.C {
		if back.C[i] != d.C[i] {
			t.Fatalf("round trip via %q: %v", out, back.C)
		}
	}
	if err := yaml.Unmarshal([]byte("c: [{}]"), &d); err == nil || !strings.Contains(err.Error(), "want a token count") {
		t.Errorf("mapping as tokens: %v", err)
	}
}

func TestQuoteAndClip(t *testing.T) {
	long := strings.Repeat("a", 1<<20)
	for _, tc := range []struct {
		in, quote, clip string
	}{
		{"64GiB", `"64GiB"`, "64GiB"},
		{"a\x1b[31mred\x1b[0m", `"a\x1b[31mred\x1b[0m"`, `a\x1b[31mred\x1b[0m`},
		{"nul\x00byte", `"nul\x00byte"`, `nul\x00byte`},
		{"bad\xffutf8", `"bad\xffutf8"`, `bad\xffutf8`},
		{"rtl\u202eoverride", `"rtl\u202eoverride"`, `rtl\u202eoverride`},
		{"tab\there", `"tab\there"`, "tab\there"},
		{"new\nline\r", `"new\nline\r"`, `new\nline\r`},
		{`q"b\s`, `"q\"b\\s"`, `q"b\s`},
		{"héllo", `"héllo"`, "héllo"},
		{long, `"` + long[:64] + `"… (1048576 bytes)`, long[:64] + "…"},
		{strings.Repeat("é", 40), `"` + strings.Repeat("é", 32) + `"… (80 bytes)`, strings.Repeat("é", 32) + "…"},
	} {
		if got := Quote(tc.in); got != tc.quote {
			t.Errorf("Quote(%.40q) = %.100s, want %.100s", tc.in, got, tc.quote)
		}
		if got := Clip(tc.in, 64); got != tc.clip {
			t.Errorf("Clip(%.40q, 64) = %.100s, want %.100s", tc.in, got, tc.clip)
		}
	}
	// However long and hostile the input, the result is bounded.
	if got := Quote(strings.Repeat("\x1b", 1<<20)); len(got) > 64*4+32 {
		t.Errorf("Quote of 1 MiB of escapes is %d bytes", len(got))
	}
}

package replay

import (
	"strings"
	"testing"
)

func TestParseCapacities(t *testing.T) {
	for _, c := range []struct {
		in      string
		want    []int64
		wantErr string
	}{
		{in: "1M,3M,10M,inf", want: []int64{1_000_000, 3_000_000, 10_000_000, 0}},
		{in: "3000000", want: []int64{3_000_000}},
		{in: " 1.5M , 4K, 4k, 1G ", want: []int64{1_500_000, 4000, 4000, 1_000_000_000}},
		{in: "infinite,Inf", want: []int64{0, 0}},
		{in: "", wantErr: "capacity list is empty"},
		{in: "1M,,3M", wantErr: `item 2 of "1M,,3M"`},
		{in: "3X", wantErr: `unknown suffix "X"`},
		{in: "512Ki", wantErr: `unknown suffix "Ki"`},
		{in: "0", wantErr: "must be positive (use inf for infinite)"},
		{in: "-5", wantErr: "must not be negative"},
		{in: "0.0001K", wantErr: "not a whole number"},
		{in: "1e30G", wantErr: "unknown suffix"},
		{in: "NaNM", wantErr: "want a number"},
	} {
		got, err := ParseCapacities(c.in)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("ParseCapacities(%q): error %v, want one containing %q", c.in, err, c.wantErr)
			}
			continue
		}
		if err != nil || len(got) != len(c.want) {
			t.Errorf("ParseCapacities(%q) = %v, %v; want %v", c.in, got, err, c.want)
			continue
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("ParseCapacities(%q)[%d] = %d, want %d", c.in, i, got[i], c.want[i])
			}
		}
	}
}

func TestFormatCapacityRoundTrips(t *testing.T) {
	for _, v := range []int64{0, 1, 512, 4000, 3_000_000, 2_000_000_000, 1_500_000, 5859 * 512} {
		s := FormatCapacity(v)
		got, err := ParseCapacities(s)
		if err != nil || len(got) != 1 || got[0] != v {
			t.Errorf("FormatCapacity(%d) = %q reads back as %v, %v", v, s, got, err)
		}
	}
}

func TestCapacityLabel(t *testing.T) {
	tests := []struct {
		tokens int64
		want   string
	}{
		{0, "inf"},
		{512, "512"},
		{6000, "6K"},
		{3_000_000, "3M"},
		{238_213 * 512, "121.97M"},
	}
	for _, tt := range tests {
		if got := CapacityLabel(tt.tokens); got != tt.want {
			t.Errorf("CapacityLabel(%d) = %q, want %q", tt.tokens, got, tt.want)
		}
	}
}

func TestSweepCapacities(t *testing.T) {
	tr := generated(t)
	caps := SweepCapacities(tr, 12)
	ws := int64(tr.UniqueBlocks()) * 512
	if len(caps) < 6 || caps[len(caps)-1] != ws {
		t.Fatalf("sweep %v: want at least 6 points ending at the working set %d", caps, ws)
	}
	for i := 1; i < len(caps); i++ {
		if caps[i] <= caps[i-1] || caps[i]%512 != 0 {
			t.Fatalf("sweep %v: not increasing whole blocks at %d", caps, i)
		}
	}
}

// FuzzParseCapacities: the parser never panics, accepted values are
// non-negative, and each accepted item formats and parses back to itself.
func FuzzParseCapacities(f *testing.F) {
	for _, s := range []string{"1M,3M,10M,inf", "3000000", "1.5M", "512Ki", "inf", "", ",", "1e3K", "-1", "9999999999999999999", "0x10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		caps, err := ParseCapacities(s)
		if err != nil {
			return
		}
		for _, c := range caps {
			if c < 0 {
				t.Fatalf("ParseCapacities(%q) gave negative %d", s, c)
			}
			back, err := ParseCapacities(FormatCapacity(c))
			if err != nil || len(back) != 1 || back[0] != c {
				t.Fatalf("%d formats as %q and reads back as %v, %v", c, FormatCapacity(c), back, err)
			}
		}
	})
}

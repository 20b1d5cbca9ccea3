package l2hugetlb

import (
	"strings"
	"testing"
)

func TestParseCount(t *testing.T) {
	if n, err := ParseCount([]byte(" 42\n")); n != 42 || err != nil {
		t.Errorf("ParseCount: %d, %v", n, err)
	}
	for _, bad := range []string{"", "-3", "x", strings.Repeat("9", 40)} {
		if _, err := ParseCount([]byte(bad)); err == nil || len(err.Error()) > 200 {
			t.Errorf("ParseCount(%q): %v", bad, err)
		}
	}
	if got, want := PoolDir(2<<20), "/sys/kernel/mm/hugepages/hugepages-2048kB"; got != want {
		t.Errorf("PoolDir(2 MiB) = %s, want %s", got, want)
	}
}

// FuzzParseCount: no panic, bounded errors, never a negative count.
func FuzzParseCount(f *testing.F) {
	f.Add([]byte("12\n"))
	f.Add([]byte("CapEff:\t0000000000004000\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := ParseCount(b)
		if err != nil && len(err.Error()) > 200 {
			t.Fatalf("unbounded error: %q", err)
		}
		if err == nil && n < 0 {
			t.Fatalf("negative count %d from %q", n, b)
		}
	})
}

package doctor

import (
	"strings"
	"testing"

	"github.com/prometheus/procfs"
)

func TestHugeMeminfo(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	if got, err := hugeMeminfo(hugeMeminfoOf(512, 500, 3, 2048)); err != nil || got != (meminfo{hugeTotal: 512, hugeFree: 500, hugeRsvd: 3, hugepageSize: 2 << 20}) {
		t.Errorf("2 MiB default: %+v, %v", got, err)
	}
	if got, err := hugeMeminfo(hugeMeminfoOf(0, 0, 0, 1<<20)); err != nil || got != (meminfo{hugepageSize: 1 << 30}) {
		t.Errorf("1 GiB default: %+v, %v", got, err)
	}
	noSize := hugeMeminfoOf(1, 1, 0, 2048)
	noSize.HugepagesizeBytes = nil
	tooMany := hugeMeminfoOf(1, 1, 0, 2048)
	tooMany.HugePagesTotal = u(1<<53 + 1)
	for _, tt := range []struct {
		name string
		in   procfs.Meminfo
		err  string
	}{
		{"no hugetlb", procfs.Meminfo{MemTotal: u(1)}, "no HugePages_Total line"},
		{"no size", noSize, "no Hugepagesize line"},
		{"overflow", tooMany, "HugePages_Total: 9007199254740993 is not a count"},
	} {
		if _, err := hugeMeminfo(tt.in); err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%s: error %v, want one containing %q", tt.name, err, tt.err)
		}
	}
}

func TestSocketPath(t *testing.T) {
	tests := []struct {
		in   string
		want string
		ok   bool
	}{
		{"127.0.0.1:9401", "", false},
		{"", "", false},
		{"unix:/run/kvtier/api.sock", "/run/kvtier/api.sock", true},
		{"unix:///run/kvtier/api.sock", "/run/kvtier/api.sock", true},
		{"/run/api.sock", "/run/api.sock", true},
		{"unix:", "", false},
		{"unix:rel.sock", "rel.sock", true},
	}
	for _, tt := range tests {
		got, ok := socketPath(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("socketPath(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

// FuzzSocketPath: a path is returned only for the unix forms, and it is a
// suffix of the input.
func FuzzSocketPath(f *testing.F) {
	for _, s := range []string{"unix:/a", "unix:///a", "/a", "h:1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, ok := socketPath(s)
		if ok && (p == "" || !strings.HasSuffix(s, p)) {
			t.Fatalf("socketPath(%q) = %q", s, p)
		}
		if !ok && p != "" {
			t.Fatalf("socketPath(%q) = %q, false", s, p)
		}
	})
}

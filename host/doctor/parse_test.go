package doctor

import (
	"strings"
	"testing"
)

func TestParseMeminfo(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want meminfo
		err  string
	}{
		{name: "real", in: "MemTotal:       263741236 kB\nHugePages_Total:     512\nHugePages_Free:      500\nHugePages_Rsvd:        3\nHugePages_Surp:        0\nHugepagesize:       2048 kB\nHugetlb:         1048576 kB\n",
			want: meminfo{hugeTotal: 512, hugeFree: 500, hugeRsvd: 3, hugepageSize: 2 << 20}},
		{name: "1 GiB default", in: "HugePages_Total: 0\nHugePages_Free: 0\nHugePages_Rsvd: 0\nHugepagesize: 1048576 kB\n",
			want: meminfo{hugepageSize: 1 << 30}},
		{name: "no hugetlb", in: "MemTotal: 1 kB\n", err: "no HugePages_Total line"},
		{name: "bad count", in: "HugePages_Total: -1\n", err: `line 1: HugePages_Total: "-1" is not a count`},
		{name: "size without unit", in: "HugePages_Total: 0\nHugePages_Free: 0\nHugePages_Rsvd: 0\nHugepagesize: 2048\n", err: "line 4: Hugepagesize"},
		{name: "count with unit", in: "HugePages_Total: 1 kB\n", err: "line 1: HugePages_Total"},
		{name: "overflow", in: "HugePages_Total: 0\nHugePages_Free: 0\nHugePages_Rsvd: 0\nHugepagesize: 99999999999999999 kB\n", err: "is not a count"},
		{name: "too many lines", in: strings.Repeat("x\n", maxMeminfoLines+1), err: "more than 4096 lines"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseMeminfo([]byte(tt.in))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestParseCountAndCapEff(t *testing.T) {
	if n, err := parseCount([]byte(" 42\n")); n != 42 || err != nil {
		t.Errorf("parseCount: %d, %v", n, err)
	}
	for _, bad := range []string{"", "-3", "x", strings.Repeat("9", 40)} {
		if _, err := parseCount([]byte(bad)); err == nil || len(err.Error()) > 200 {
			t.Errorf("parseCount(%q): %v", bad, err)
		}
	}
	if v, err := parseCapEff([]byte("Name:\tx\nCapEff:\t0000000000004000\n")); v != 1<<capIPCLock || err != nil {
		t.Errorf("parseCapEff: %x, %v", v, err)
	}
	for _, bad := range []string{"Name: x\n", "CapEff:\tzz\n"} {
		if _, err := parseCapEff([]byte(bad)); err == nil {
			t.Errorf("parseCapEff(%q): no error", bad)
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

// FuzzParseMeminfo: any input gives a result or an error, never a panic,
// and a result holds no negative count.
func FuzzParseMeminfo(f *testing.F) {
	f.Add([]byte("HugePages_Total: 4\nHugePages_Free: 4\nHugePages_Rsvd: 0\nHugepagesize: 2048 kB\n"))
	f.Add([]byte("HugePages_Total:\nHugepagesize: kB kB\n"))
	f.Add([]byte(":::\n\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseMeminfo(b)
		if err == nil && (m.hugeTotal < 0 || m.hugeFree < 0 || m.hugeRsvd < 0 || m.hugepageSize < 0) {
			t.Fatalf("negative count from %q: %+v", b, m)
		}
		if err != nil && len(err.Error()) > 512+len(b) {
			t.Fatalf("unbounded error: %d bytes", len(err.Error()))
		}
	})
}

// FuzzParseCapEff and parseCount: no panic, bounded errors.
func FuzzParseCapEff(f *testing.F) {
	f.Add([]byte("CapEff:\t0000000000004000\n"))
	f.Add([]byte("12\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = parseCapEff(b)
		if _, err := parseCount(b); err != nil && len(err.Error()) > 200 {
			t.Fatalf("unbounded error: %q", err)
		}
	})
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

package pluginbench

import (
	"os"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	cases := []struct {
		line string
		want time.Duration
		bad  bool
	}{
		{"1234 (kvtier-plugin) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0", 3 * time.Second, false},
		{"1234 (a (b) c) R 1 2 3 4 5 6 7 8 9 10 1 2 0", 30 * time.Millisecond, false},
		{"1234 (x) S 1 2", 0, true},
		{"no command field", 0, true},
		{"1 (x) S 1 2 3 4 5 6 7 8 9 10 -1 2 0", 0, true},
	}
	for _, c := range cases {
		got, err := parseStatCPU([]byte(c.line))
		if (err != nil) != c.bad || (!c.bad && got != c.want) {
			t.Errorf("%q: %v %v, want %v (bad %v)", c.line, got, err, c.want, c.bad)
		}
	}
	if _, err := procCPU(os.Getpid()); err != nil {
		t.Fatalf("own stat: %v", err)
	}
	if selfCPU() <= 0 {
		t.Fatal("no CPU time for this process")
	}
}

func FuzzParseStatCPU(f *testing.F) {
	f.Add([]byte("1234 (kvtier-plugin) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0"))
	f.Add([]byte("1 ()) ) 2"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if d, err := parseStatCPU(b); err == nil && d < 0 {
			t.Fatalf("negative cpu %v from %q", d, b)
		}
	})
}

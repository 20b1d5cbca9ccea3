package main

import (
	"strings"
	"testing"
)

func TestParseSimFaults(t *testing.T) {
	for _, tc := range []struct {
		spec string
		n    int
		err  string
	}{
		{"", 0, ""},
		{"stall:2@100", 1, ""},
		{"stall:2@100, crash:0@5", 2, ""},
		{"stall:8@1", 0, "rank"},
		{"nap:1@1", 0, "kind"},
		{"stall:1", 0, "KIND:RANK@TICK"},
		{"crash:1@x", 0, "tick"},
	} {
		fs, err := parseSimFaults(tc.spec, 8)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want one naming %s", tc.spec, err, tc.err)
			}
			continue
		}
		if err != nil || len(fs) != tc.n {
			t.Errorf("%q: %v, %d faults, want %d", tc.spec, err, len(fs), tc.n)
		}
	}
}

func FuzzParseSimFaults(f *testing.F) {
	f.Add("stall:2@100,crash:1@5")
	f.Fuzz(func(t *testing.T, spec string) {
		fs, err := parseSimFaults(spec, 4)
		if err == nil {
			for _, x := range fs {
				if x.Rank < 0 || x.Rank >= 4 {
					t.Fatalf("%q: rank %d accepted", spec, x.Rank)
				}
			}
		}
	})
}

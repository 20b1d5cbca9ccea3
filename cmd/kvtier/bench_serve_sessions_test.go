package main

import (
	"errors"
	"slices"
	"testing"
)

func TestParseSessionCounts(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []int
		bad  bool
	}{
		{in: []string{"1", "8"}, want: []int{1, 8}},
		{in: []string{"2", "4", "64"}, want: []int{2, 4, 64}},
		{in: []string{"1"}, bad: true},
		{in: nil, bad: true},
		{in: []string{"1", "0"}, bad: true},
		{in: []string{"1", "65"}, bad: true},
		{in: []string{"1", "x"}, bad: true},
		{in: []string{"1", "-3"}, bad: true},
	} {
		got, err := parseSessionCounts(tc.in)
		if tc.bad {
			if !errors.Is(err, errUsage) {
				t.Errorf("parseSessionCounts(%q) = %v, %v; want a usage error", tc.in, got, err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("parseSessionCounts(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

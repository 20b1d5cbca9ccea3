package pagehash

import (
	"strings"
	"testing"
)

// FuzzParse: Parse never panics, and whatever it accepts prints back as
// the same hash (lowercase hex of the input).
func FuzzParse(f *testing.F) {
	f.Add(strings.Repeat("0", 64))
	f.Add(Next(Root, []uint32{1, 2}).String())
	f.Add("6DB65FD59FD356F6729140571B5BCD6BB3B83492A16E1BF0A3884442FC3C8A0E")
	f.Add("")
	f.Add("xyz")
	f.Add(strings.Repeat("g", 64))
	f.Fuzz(func(t *testing.T, s string) {
		h, err := Parse(s)
		if err != nil {
			return
		}
		if h.String() != strings.ToLower(s) {
			t.Fatalf("Parse(%q) = %s: does not print back", s, h)
		}
		again, err := Parse(h.String())
		if err != nil || again != h {
			t.Fatalf("round trip of %s: %s, %v", h, again, err)
		}
	})
}

// FuzzChain: Chain agrees with the written-out definition for any bytes
// read as tokens and any small page size.
func FuzzChain(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 2, 0, 0, 0, 3}, uint8(2))
	f.Add([]byte{}, uint8(1))
	f.Add(make([]byte, 64), uint8(16))
	f.Fuzz(func(t *testing.T, raw []byte, pt uint8) {
		if pt == 0 {
			return
		}
		tokens := make([]uint32, len(raw)/4)
		for i := range tokens {
			tokens[i] = uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24
		}
		got := Chain(nil, Root, tokens, int(pt))
		want := reference(tokens, int(pt))
		if len(got) != len(want) {
			t.Fatalf("%d hashes, want %d", len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("h[%d] = %s, want %s", i, got[i], want[i])
			}
		}
	})
}

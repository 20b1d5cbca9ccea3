package consensus

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

var testEnv = Envelope{Group: 0xabc, Stack: 0xdef, Rank: 3, Size: 8}
var testExpect = Expect{Group: 0xabc, Stack: 0xdef, Size: 8, Peer: "127.0.0.1:9"}

func TestCodecRoundTrip(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 3))
		s := randomShape(rng)
		c := RandomContribution(rng, rng.Uint64(), s, Digest{1, 2, byte(seed)})
		b, err := AppendContribution(nil, testEnv, c)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if len(b) != encodedLen(s) {
			t.Fatalf("seed %d: %d bytes, want %d", seed, len(b), encodedLen(s))
		}
		env, got, err := DecodeContribution(b, testExpect)
		if err != nil || env != testEnv || !got.Equal(c) {
			t.Fatalf("seed %d: round trip: %v %+v %+v", seed, err, env, got)
		}
		fb, err := AppendFrontier(nil, testEnv, Frontier(c))
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		_, f, err := DecodeFrontier(fb, testExpect)
		if err != nil || !f.Equal(Frontier(c)) {
			t.Fatalf("seed %d: frontier round trip: %v", seed, err)
		}
		if _, _, err := DecodeContribution(fb, testExpect); !errors.Is(err, ErrMalformed) {
			t.Fatalf("seed %d: a frontier decoded as a contribution: %v", seed, err)
		}
	}
}

// TestDecodeIntoReuses decodes 300 contributions of random shapes one
// after another into the same vectors: each equals its plain decode (no
// value of an earlier, larger or digested message shows through), and a
// message that fits the vectors allocates nothing.
func TestDecodeIntoReuses(t *testing.T) {
	var dst Contribution
	for seed := uint64(1); seed <= 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, 5))
		c := RandomContribution(rng, rng.Uint64(), randomShape(rng), Digest{byte(seed)})
		b, err := AppendContribution(nil, testEnv, c)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		_, want, err := DecodeContribution(b, testExpect)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		_, got, err := DecodeContributionInto(b, testExpect, dst)
		if err != nil || !got.Equal(want) || !got.Equal(c) {
			t.Fatalf("seed %d: into reused vectors: %v %+v, want %+v", seed, err, got, want)
		}
		dst = got
		if n := testing.AllocsPerRun(10, func() { _, dst, _ = DecodeContributionInto(b, testExpect, dst) }); n != 0 {
			t.Fatalf("seed %d: %v allocations decoding into vectors that fit", seed, n)
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	c := mk(42, Shape{Classes: 1, OKBits: 3, Reloads: 1, Digest: true}, []Counts{{1, 2, 3, 4}}, []bool{true, false, true}, []uint32{7})
	good, err := AppendContribution(nil, testEnv, c)
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	set := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	for _, tc := range []struct {
		name string
		b    []byte
		exp  Expect
		want error
		msg  []string
	}{
		{"truncated", good[:len(good)-1], testExpect, ErrMalformed, []string{"rank 3 (127.0.0.1:9)", "tick 42"}},
		{"truncated header", good[:20], testExpect, ErrMalformed, []string{"127.0.0.1:9", "unknown tick"}},
		{"oversize", append(bytes.Clone(good), 0), testExpect, ErrMalformed, []string{"rank 3", "tick 42"}},
		{"bad magic", set(func(b []byte) []byte { b[0] = 'X'; return b }), testExpect, ErrMalformed, nil},
		{"unknown flag", set(func(b []byte) []byte { b[5] |= 4; return b }), testExpect, ErrMalformed, nil},
		{"another group", good, Expect{Group: 1, Stack: 0xdef, Size: 8}, ErrForeign, []string{"rank 3", "tick 42", "group 0xabc"}},
		{"another stack", good, Expect{Group: 0xabc, Stack: 2, Size: 8}, ErrForeign, []string{"stack 0xdef"}},
		{"another size", good, Expect{Group: 0xabc, Stack: 0xdef, Size: 4}, ErrForeign, []string{"size 8"}},
		{"rank outside", set(func(b []byte) []byte { le.PutUint32(b[32:], 9); return b }), testExpect, ErrForeign, []string{"rank 9"}},
		{"classes beyond bound", set(func(b []byte) []byte { le.PutUint16(b[40:], MaxClasses+1); return b }), testExpect, ErrShape, []string{"tick 42"}},
		{"ok bits claim", set(func(b []byte) []byte { le.PutUint32(b[44:], 1<<30); return b }), testExpect, ErrShape, nil},
		{"reloads claim", set(func(b []byte) []byte { le.PutUint32(b[48:], 5); return b }), testExpect, ErrMalformed, []string{"needs"}},
		{"padding bit", set(func(b []byte) []byte { b[headerLen+32] |= 0x80; return b }), testExpect, ErrMalformed, []string{"past bit 3"}},
		{"structures without digest", set(func(b []byte) []byte { b[5] = 0; le.PutUint16(b[42:], 4); return b }), testExpect, ErrShape, nil},
	} {
		_, _, err := DecodeContribution(tc.b, tc.exp)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
			continue
		}
		var pe *PeerError
		if !errors.As(err, &pe) {
			t.Errorf("%s: %v is not a *PeerError", tc.name, err)
		}
		for _, m := range tc.msg {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("%s: error %q does not say %q", tc.name, err, m)
			}
		}
	}
}

func TestEncodeRefuses(t *testing.T) {
	if _, err := AppendContribution(nil, testEnv, Contribution{Shape: testShape}); !errors.Is(err, ErrShape) {
		t.Errorf("a contribution not fitting its shape: got %v", err)
	}
	if _, err := AppendContribution(nil, Envelope{Rank: 8, Size: 8}, NewContribution(1, testShape)); !errors.Is(err, ErrForeign) {
		t.Errorf("a rank outside the group: got %v", err)
	}
}

func fuzzSeeds(f *testing.F, frontier bool) {
	for seed := uint64(1); seed <= 8; seed++ {
		rng := rand.New(rand.NewPCG(seed, 5))
		c := RandomContribution(rng, seed, randomShape(rng), Digest{byte(seed)})
		var b []byte
		if frontier {
			b, _ = AppendFrontier(nil, testEnv, Frontier(c))
		} else {
			b, _ = AppendContribution(nil, testEnv, c)
		}
		f.Add(b)
	}
	f.Add([]byte("KVC1"))
}

// FuzzDecodeContribution: any bytes are refused with a *PeerError or
// decode to a contribution that fits its shape and re-encodes to the same
// bytes (the encoding is canonical).
func FuzzDecodeContribution(f *testing.F) {
	fuzzSeeds(f, false)
	f.Fuzz(func(t *testing.T, b []byte) {
		env, c, err := DecodeContribution(b, testExpect)
		if err != nil {
			var pe *PeerError
			if !errors.As(err, &pe) {
				t.Fatalf("%v is not a *PeerError", err)
			}
			return
		}
		if err := c.Check(); err != nil {
			t.Fatalf("decoded a contribution that does not fit its shape: %v", err)
		}
		again, err := AppendContribution(nil, env, c)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: %v", err)
		}
	})
}

// FuzzDecodeFrontier is FuzzDecodeContribution for frontiers.
func FuzzDecodeFrontier(f *testing.F) {
	fuzzSeeds(f, true)
	f.Fuzz(func(t *testing.T, b []byte) {
		env, fr, err := DecodeFrontier(b, testExpect)
		if err != nil {
			var pe *PeerError
			if !errors.As(err, &pe) {
				t.Fatalf("%v is not a *PeerError", err)
			}
			return
		}
		again, err := AppendFrontier(nil, env, fr)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: %v", err)
		}
	})
}

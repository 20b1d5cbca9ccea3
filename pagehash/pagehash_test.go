package pagehash

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"testing"
)

// reference is the definition written out directly: one SHA-256 over the
// previous hash and the page's tokens as little-endian uint32.
func reference(tokens []uint32, pageTokens int) []Hash {
	var out []Hash
	prev := Root
	for i := 0; (i+1)*pageTokens <= len(tokens); i++ {
		msg := bytes.NewBuffer(append([]byte(nil), prev[:]...))
		for _, tok := range tokens[i*pageTokens : (i+1)*pageTokens] {
			binary.Write(msg, binary.LittleEndian, tok)
		}
		prev = sha256.Sum256(msg.Bytes())
		out = append(out, prev)
	}
	return out
}

// TestChainMatchesReference compares Chain with the written-out definition
// on seeded random sequences, including pages longer than Next's internal
// buffer (256 tokens).
func TestChainMatchesReference(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 1))
		pt := 1 + rng.IntN(700)
		tokens := make([]uint32, rng.IntN(3*pt+5))
		for i := range tokens {
			tokens[i] = rng.Uint32()
		}
		got := Chain(nil, Root, tokens, pt)
		want := reference(tokens, pt)
		if len(got) != len(want) {
			t.Fatalf("seed %d: %d hashes, want %d", seed, len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("seed %d (page_tokens %d): h[%d] = %s, want %s", seed, pt, i, got[i], want[i])
			}
		}
	}
}

// TestChainAppendsAndContinues: Chain appends to dst, and chaining a
// sequence in two calls (the second after the first's last hash) equals
// one call, which is how the radix tree hashes only the new pages.
func TestChainAppendsAndContinues(t *testing.T) {
	tokens := make([]uint32, 40)
	for i := range tokens {
		tokens[i] = uint32(i * 7)
	}
	whole := Chain(nil, Root, tokens, 4)
	first := Chain([]Hash{{1}}, Root, tokens[:12], 4)
	if first[0] != (Hash{1}) || len(first) != 4 {
		t.Fatalf("Chain did not append to dst: %d hashes", len(first))
	}
	rest := Chain(nil, first[3], tokens[12:], 4)
	if got := append(first[1:], rest...); len(got) != len(whole) || got[9] != whole[9] || got[2] != whole[2] {
		t.Fatalf("chaining in two calls differs from one call")
	}
	if Next(Root, tokens[:4]) != whole[0] {
		t.Fatalf("Next(Root, page 0) != h[0]")
	}
}

func TestChainRejectsBadPageTokens(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Chain with page_tokens 0 did not panic")
		}
	}()
	Chain(nil, Root, []uint32{1}, 0)
}

func TestParse(t *testing.T) {
	h := Next(Root, []uint32{1, 2})
	for _, c := range []struct {
		in      string
		want    Hash
		wantErr string
	}{
		{in: h.String(), want: h},
		{in: strings.ToUpper(h.String()), want: h},
		{in: strings.Repeat("0", 64), want: Root},
		{in: "", wantErr: "want 64 hex characters, got 0"},
		{in: h.String()[:63], wantErr: "want 64 hex characters, got 63"},
		{in: h.String() + "00", wantErr: "want 64 hex characters, got 66"},
		{in: "zz" + h.String()[2:], wantErr: "invalid byte"},
	} {
		got, err := Parse(c.in)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("Parse(%q): error %v, want one containing %q", c.in, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("Parse(%q) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
	if h.Short() != h.String()[:16] {
		t.Errorf("Short() = %s, want the first 16 hex characters of %s", h.Short(), h)
	}
}

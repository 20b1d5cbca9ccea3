package consensus

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
)

func encodedGroup(t testing.TB, rng *rand.Rand, size int, tick uint64) ([][]byte, []Contribution) {
	t.Helper()
	s := Shape{Classes: 2, OKBits: 5, Reloads: 3}
	msgs := make([][]byte, size)
	cs := make([]Contribution, size)
	for r := range size {
		cs[r] = RandomContribution(rng, tick, s, Digest{})
		b, err := AppendContribution(nil, Envelope{Group: 7, Stack: 9, Rank: r, Size: size}, cs[r])
		if err != nil {
			t.Fatal(err)
		}
		msgs[r] = b
	}
	return msgs, cs
}

// TestReduceEncoded: the wire reduce equals Reduce whatever the order of
// the messages, and refuses a missing, doubled or foreign rank.
func TestReduceEncoded(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	msgs, cs := encodedGroup(t, rng, 4, 11)
	want, err := Reduce(11, cs)
	if err != nil {
		t.Fatal(err)
	}
	rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	b, err := ReduceEncoded(msgs)
	if err != nil {
		t.Fatal(err)
	}
	env, f, err := DecodeFrontier(b, Expect{Group: 7, Stack: 9, Size: 4})
	if err != nil || env.Rank != -1 || !f.Equal(want) {
		t.Fatalf("ReduceEncoded = %v, %v; want %v", f, err, want)
	}
	other, _ := encodedGroup(t, rng, 4, 12)
	for _, tc := range []struct {
		name string
		msgs [][]byte
		want error
	}{
		{"none", nil, ErrShape},
		{"missing rank", msgs[:3], ErrShape},
		{"doubled rank", [][]byte{msgs[0], msgs[1], msgs[2], msgs[2]}, ErrShape},
		{"other tick", [][]byte{msgs[0], msgs[1], msgs[2], other[3]}, ErrTick},
		{"truncated", [][]byte{msgs[0][:20], msgs[1], msgs[2], msgs[3]}, ErrMalformed},
	} {
		if _, err := ReduceEncoded(tc.msgs); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
}

// FuzzReduceEncoded: any bytes are refused with an error or reduce to a
// frontier that decodes; never a panic.
func FuzzReduceEncoded(f *testing.F) {
	msgs, _ := encodedGroup(f, rand.New(rand.NewPCG(1, 2)), 2, 3)
	f.Add(msgs[0], msgs[1])
	f.Add(msgs[1], msgs[0])
	f.Add(msgs[0], msgs[0])
	f.Fuzz(func(t *testing.T, a, b []byte) {
		out, err := ReduceEncoded([][]byte{a, b})
		if err != nil {
			return
		}
		if _, _, err := DecodeFrontier(out, Expect{Group: binary.LittleEndian.Uint64(a[8:]), Stack: binary.LittleEndian.Uint64(a[16:]), Size: 2}); err != nil {
			t.Fatalf("reduced frontier does not decode: %v", err)
		}
	})
}

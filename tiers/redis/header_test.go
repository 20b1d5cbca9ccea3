package redis_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/redis"
)

func testKey(seed uint32) tiers.Key {
	return tiers.Key{Hash: pagehash.Next(pagehash.Root, []uint32{seed}), Kind: tiers.PayloadKind(seed % 3)}
}

// TestValueRoundTrip encodes values of several sizes and verifies them
// back.
func TestValueRoundTrip(t *testing.T) {
	const seed = 0x5eed
	t.Logf("seed %#x", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	for _, n := range []int{0, 1, 63, 64 << 10, 64<<10 + 1, 3 << 20} {
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		k := testKey(uint32(n))
		v := redis.EncodeValue(make([]byte, redis.TrailerSize+n), k, src)
		got, err := redis.VerifyValue(v, k, int64(n))
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if !bytes.Equal(got, src) {
			t.Fatalf("%d bytes: payload differs", n)
		}
		h, err := redis.DecodeTrailer(v)
		if err != nil || h.Hash != k.Hash || h.Kind != k.Kind || h.Length != uint64(n) {
			t.Fatalf("%d bytes: trailer %+v, %v", n, h, err)
		}
		if !bytes.Equal(v[:n], src) {
			t.Fatalf("%d bytes: the payload is not at the start of the value", n)
		}
	}
}

// TestVerifyRejects flips every kind of field and checks that each is a
// named ErrBadValue.
func TestVerifyRejects(t *testing.T) {
	k := testKey(7)
	src := bytes.Repeat([]byte("kvtier"), 1000)
	good := redis.EncodeValue(make([]byte, redis.TrailerSize+len(src)), k, src)
	other := testKey(8)
	for _, tc := range []struct {
		name  string
		value func() []byte
		key   tiers.Key
		size  int64
		want  string
	}{
		{"short", func() []byte { return good[:10] }, k, int64(len(src)), "at least 64"},
		{"magic", func() []byte { v := clone(good); v[len(src)] ^= 1; return v }, k, int64(len(src)), "magic"},
		{"trailer crc", func() []byte { v := clone(good); v[len(src)+20] ^= 1; return v }, k, int64(len(src)), "value trailer: crc"},
		{"trailer's own crc", func() []byte { v := clone(good); v[len(v)-1] ^= 1; return v }, k, int64(len(src)), "value trailer: crc"},
		{"payload", func() []byte { v := clone(good); v[0] ^= 1; return v }, k, int64(len(src)), "value payload: crc"},
		{"last payload byte", func() []byte { v := clone(good); v[len(src)-1] ^= 1; return v }, k, int64(len(src)), "value payload: crc"},
		{"payload without its trailer yet", func() []byte { return good[:len(src)] }, k, int64(len(src)), "no trailer"},
		{"version 1 value", func() []byte { return redis.EncodeVersion1(make([]byte, redis.TrailerSize+len(src)), k, src) }, k, int64(len(src)), "format version 1"},
		{"version 1 header only", func() []byte { return redis.EncodeVersion1(make([]byte, redis.TrailerSize), k, nil) }, k, 0, "format version 1"},
		{"other hash", func() []byte { return good }, tiers.Key{Hash: other.Hash, Kind: k.Kind}, int64(len(src)), "page hash"},
		{"other kind", func() []byte { return good }, tiers.Key{Hash: k.Hash, Kind: k.Kind + 1}, int64(len(src)), "payload kind"},
		{"other page size", func() []byte { return good }, k, int64(len(src)) + 1, "payload length"},
		{"truncated", func() []byte { return good[1:] }, k, int64(len(src)), "payload bytes before the trailer"},
		{"appended after", func() []byte { return append(clone(good), 0) }, k, int64(len(src)), "magic"},
		{"prepended", func() []byte { return append([]byte{0}, good...) }, k, int64(len(src)), "payload bytes before the trailer"},
		{"trailer alone (an APPEND after a refused SET)", func() []byte { return clone(good[len(src):]) }, k, int64(len(src)), "0 payload bytes before the trailer"},
		{"trailer twice (two torn appends)", func() []byte { return append(clone(good), good[len(src):]...) }, k, int64(len(src)), "payload bytes before the trailer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := redis.VerifyValue(tc.value(), tc.key, tc.size)
			if !errors.Is(err, redis.ErrBadValue) || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
				t.Fatalf("error %v, want ErrBadValue mentioning %q", err, tc.want)
			}
		})
	}
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

// FuzzVerifyValue: any reply bytes are a verified payload or ErrBadValue,
// never a panic; a verified payload is exactly what the trailer describes.
func FuzzVerifyValue(f *testing.F) {
	k := testKey(1)
	src := []byte("the payload of one page")
	good := redis.EncodeValue(make([]byte, redis.TrailerSize+len(src)), k, src)
	f.Add(good, int64(len(src)))
	f.Add(good[len(src):], int64(0))
	f.Add(redis.EncodeVersion1(make([]byte, redis.TrailerSize+len(src)), k, src), int64(len(src)))
	f.Add([]byte("+OK"), int64(3))
	f.Add([]byte{}, int64(-1))
	f.Fuzz(func(t *testing.T, value []byte, size int64) {
		if _, err := redis.DecodeTrailer(value); err != nil && !errors.Is(err, redis.ErrBadValue) {
			t.Fatalf("decode error %v does not wrap ErrBadValue", err)
		}
		payload, err := redis.VerifyValue(value, k, size)
		if err != nil {
			if !errors.Is(err, redis.ErrBadValue) {
				t.Fatalf("verify error %v does not wrap ErrBadValue", err)
			}
			return
		}
		if int64(len(payload)) != size {
			t.Fatalf("verified payload of %d bytes for page size %d", len(payload), size)
		}
		again := redis.EncodeValue(make([]byte, redis.TrailerSize+len(payload)), k, payload)
		if !bytes.Equal(again, value) {
			t.Fatal("a verified value is not the encoding of its payload")
		}
	})
}

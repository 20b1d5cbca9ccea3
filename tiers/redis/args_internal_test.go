package redis

import (
	"bytes"
	"testing"

	"github.com/kvtier/kvtier/internal/crc32c"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

// TestPutArgs: the SET's argument is the slab's own bytes (no copy), the
// APPEND's the trailer that makes them a verified value; marshaled again,
// as on a retry, both are the same, and a trailer marshaled without its
// SET still waits for a checksum.
func TestPutArgs(t *testing.T) {
	src := bytes.Repeat([]byte("0123456789abcdef"), 4096+3)
	key := tiers.Key{Hash: pagehash.Next(pagehash.Root, []uint32{7}), Kind: 1}
	p := newPageCRC(key, src)
	for range 2 {
		payload, err := payloadArg{p}.MarshalBinary()
		if err != nil || &payload[0] != &src[0] || len(payload) != len(src) {
			t.Fatalf("payload argument is not the source span (err %v)", err)
		}
		trailer, err := trailerArg{p}.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		value := append(append([]byte(nil), payload...), trailer...)
		if got, err := VerifyValue(value, key, int64(len(src))); err != nil || !bytes.Equal(got, src) {
			t.Fatalf("SET+APPEND value does not verify: %v", err)
		}
		if want := EncodeValue(make([]byte, len(src)+TrailerSize), key, src); !bytes.Equal(value, want) {
			t.Fatal("SET+APPEND value differs from EncodeValue's")
		}
	}
	alone := newPageCRC(key, src)
	trailer, _ := trailerArg{alone}.MarshalBinary()
	if _, err := VerifyValue(append(append([]byte(nil), src...), trailer...), key, int64(len(src))); err != nil {
		t.Fatalf("trailer marshaled before its payload: %v", err)
	}
}

// TestGivenSumArgs: with the producer's sum the trailer carries it as
// given: a value whose payload matches verifies; one whose payload changed
// after the sum was taken fails verification (a GET of it is a miss),
// where a checksum of our own would have made it look valid.
func TestGivenSumArgs(t *testing.T) {
	orig := bytes.Repeat([]byte("fedcba9876543210"), 4096+5)
	key := tiers.Key{Hash: pagehash.Next(pagehash.Root, []uint32{9}), Kind: 0}
	sum := crc32c.Checksum(orig)
	cases := []struct {
		name   string
		flip   int // byte of the source flipped after the sum; -1 none
		wantOK bool
	}{
		{"unchanged", -1, true},
		{"first byte changed", 0, false},
		{"last byte changed", len(orig) - 1, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := bytes.Clone(orig)
			if c.flip >= 0 {
				src[c.flip] ^= 0x10
			}
			p := givenPageCRC(key, src, sum)
			payload, _ := payloadArg{p}.MarshalBinary()
			trailer, err := trailerArg{p}.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			got, err := VerifyValue(append(bytes.Clone(payload), trailer...), key, int64(len(src)))
			switch {
			case c.wantOK && (err != nil || !bytes.Equal(got, orig)):
				t.Fatalf("value does not verify: %v", err)
			case !c.wantOK && err == nil:
				t.Fatal("a payload changed after the producer's sum verified: laundered")
			}
		})
	}
}

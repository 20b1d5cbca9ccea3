package redis

import (
	"bytes"
	"testing"

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

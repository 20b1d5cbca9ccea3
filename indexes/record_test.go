package indexes

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/pagehash"
)

func testKey(b byte, kind uint8) Key {
	var h pagehash.Hash
	for i := range h {
		h[i] = b + byte(i)
	}
	return Key{Hash: h, Kind: kind}
}

func TestRecordRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		key  Key
		rec  Record
	}{
		{"zero", Key{}, Record{}},
		{"typical", testKey(7, 1), Record{Disk: 3, Kind: 1, Slot: 123456, Epoch: 9, LastAccess: 77}},
		{"max", testKey(0xff, 0xff), Record{Disk: math.MaxUint16, Kind: 0xff, Slot: math.MaxUint64, Epoch: math.MaxUint64, LastAccess: math.MaxUint64}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b [RecordSize]byte
			EncodeRecord(&b, tt.key, tt.rec)
			if b[0] != RecordVersion {
				t.Fatalf("version byte %d, want %d", b[0], RecordVersion)
			}
			got, err := DecodeRecord(tt.key, b[:])
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if got != tt.rec {
				t.Fatalf("decode = %+v, want %+v", got, tt.rec)
			}
		})
	}
}

func TestRecordDecodeCorrupt(t *testing.T) {
	key := testKey(1, 2)
	var good [RecordSize]byte
	EncodeRecord(&good, key, Record{Disk: 1, Kind: 2, Slot: 3, Epoch: 4, LastAccess: 5})
	tests := []struct {
		name   string
		mutate func([]byte) []byte
		key    Key
		substr string
	}{
		{"short", func(b []byte) []byte { return b[:RecordSize-1] }, key, "want 32 bytes, got 31"},
		{"long", func(b []byte) []byte { return append(b, 0) }, key, "want 32 bytes, got 33"},
		{"empty", func([]byte) []byte { return nil }, key, "got 0"},
		{"version", func(b []byte) []byte { b[0] = 2; return b }, key, "format version 2"},
		{"bit flip in slot", func(b []byte) []byte { b[5] ^= 0x10; return b }, key, "check value"},
		{"bit flip in crc", func(b []byte) []byte { b[30] ^= 1; return b }, key, "check value"},
		{"other key", func(b []byte) []byte { return b }, testKey(9, 2), "check value"},
		{"other kind", func(b []byte) []byte { return b }, testKey(1, 3), "check value"},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := append([]byte(nil), good[:]...)
			_, err := DecodeRecord(tt.key, tt.mutate(b))
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err = %v, want ErrCorrupt", err)
			}
			if !strings.Contains(err.Error(), tt.substr) || !strings.Contains(err.Error(), tt.key.String()) {
				t.Fatalf("err %q does not contain %q and the key %s", err, tt.substr, tt.key)
			}
		})
	}
}

// TestRecordBoundToKey moves a record under every key that differs from
// its own in one bit (of the hash or the kind) and requires each to fail.
func TestRecordBoundToKey(t *testing.T) {
	key := testKey(5, 2)
	var b [RecordSize]byte
	EncodeRecord(&b, key, Record{Disk: 1, Kind: 2, Slot: 3, Epoch: 4, LastAccess: 5})
	for bit := range 8 * (len(key.Hash) + 1) {
		other := key
		if byteIdx := bit / 8; byteIdx < len(key.Hash) {
			other.Hash[byteIdx] ^= 1 << (bit % 8)
		} else {
			other.Kind ^= 1 << (bit % 8)
		}
		if _, err := DecodeRecord(other, b[:]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("record of %s decoded under %s (bit %d flipped): err = %v", key, other, bit, err)
		}
	}
}

func TestSameLocation(t *testing.T) {
	base := Record{Disk: 1, Kind: 2, Slot: 3, Epoch: 4, LastAccess: 5}
	tests := []struct {
		name string
		o    Record
		want bool
	}{
		{"identical", base, true},
		{"other access and kind", Record{Disk: 1, Kind: 9, Slot: 3, Epoch: 4, LastAccess: 99}, true},
		{"other disk", Record{Disk: 2, Slot: 3, Epoch: 4}, false},
		{"other slot", Record{Disk: 1, Slot: 4, Epoch: 4}, false},
		{"other epoch", Record{Disk: 1, Slot: 3, Epoch: 5}, false},
	}
	for _, tt := range tests {
		if got := base.SameLocation(tt.o); got != tt.want {
			t.Errorf("%s: SameLocation = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	key := testKey(3, 1)
	var good [RecordSize]byte
	EncodeRecord(&good, key, Record{Disk: 1, Kind: 1, Slot: 2, Epoch: 3, LastAccess: 4})
	f.Add(good[:], uint8(1))
	f.Add(good[:], uint8(0))
	f.Add([]byte{}, uint8(0))
	f.Add(make([]byte, RecordSize), uint8(0))
	f.Add(append(good[:], 1), uint8(1))
	f.Fuzz(func(t *testing.T, b []byte, kind uint8) {
		k := key
		k.Kind = kind
		r, err := DecodeRecord(k, b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("decode error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		// Whatever decodes must re-encode to the same bytes.
		var again [RecordSize]byte
		EncodeRecord(&again, k, r)
		if string(again[:]) != string(b) {
			t.Fatalf("re-encode differs:\n got %x\nwant %x", again, b)
		}
	})
}

// TestKeyFoldStructured checks that keys built in patterns (as tests and
// synthetic workloads build them) fold to distinct values.
func TestKeyFoldStructured(t *testing.T) {
	seen := map[uint32]Key{}
	for b := range 256 {
		for kind := range 4 {
			for _, k := range []Key{testKey(byte(b), uint8(kind)), {Hash: [32]byte{byte(b)}, Kind: uint8(kind)}, {Hash: [32]byte{31: byte(b)}, Kind: uint8(kind)}} {
				f := keyFold(&k)
				if prev, ok := seen[f]; ok && prev != k {
					t.Fatalf("keys %s and %s fold alike (%08x)", prev, k, f)
				}
				seen[f] = k
			}
		}
	}
}

// FuzzDecodeKey: any bytes either decode to a key whose encoding is
// exactly those bytes, or fail with ErrCorrupt naming the length.
func FuzzDecodeKey(f *testing.F) {
	var good [KeySize]byte
	EncodeKey(&good, testKey(7, 2))
	f.Add(good[:])
	f.Add([]byte{})
	f.Add(good[:KeySize-1])
	f.Add(append(good[:], 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := DecodeKey(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) || len(b) == KeySize {
				t.Fatalf("DecodeKey(%x): %v", b, err)
			}
			return
		}
		var again [KeySize]byte
		EncodeKey(&again, k)
		if string(again[:]) != string(b) {
			t.Fatalf("re-encode differs:\n got %x\nwant %x", again, b)
		}
	})
}

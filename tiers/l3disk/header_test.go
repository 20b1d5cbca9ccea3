package l3disk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/kvtier/kvtier/pagehash"
)

func sampleHeader() SlotHeader {
	var h pagehash.Hash
	for i := range h {
		h[i] = byte(i * 7)
	}
	return SlotHeader{Version: FormatVersion, Kind: 1, Epoch: epochFor(3, 2), Hash: h, PayloadLen: 20000, PayloadCRC: 0xdeadbeef}
}

func TestSlotHeaderRoundTrip(t *testing.T) {
	for _, v := range []uint16{minFormatVersion, FormatVersion} {
		want := sampleHeader()
		want.Version = v
		b := make([]byte, HeaderSize)
		want.Encode(b)
		got, err := DecodeSlotHeader(b)
		if err != nil || got != want {
			t.Fatalf("version %d: decode = %+v, %v; want %+v", v, got, err, want)
		}
	}
}

func TestSlotHeaderRejects(t *testing.T) {
	good := make([]byte, HeaderSize)
	sampleHeader().Encode(good)
	reseal := func(b []byte) { binary.LittleEndian.PutUint32(b[60:], PayloadCRC(b[:60])) }
	for _, tc := range []struct {
		name string
		mut  func(b []byte) []byte
	}{
		{"short", func(b []byte) []byte { return b[:HeaderSize-1] }},
		{"zeros", func(b []byte) []byte { return make([]byte, HeaderSize) }},
		{"magic", func(b []byte) []byte { b[0] ^= 1; reseal(b); return b }},
		{"version 0", func(b []byte) []byte { b[4] = 0; reseal(b); return b }},
		{"version from the future", func(b []byte) []byte { b[4] = FormatVersion + 1; reseal(b); return b }},
		{"reserved byte", func(b []byte) []byte { b[7] = 1; reseal(b); return b }},
		{"reserved word", func(b []byte) []byte { b[57] = 1; reseal(b); return b }},
		{"bit flip in hash", func(b []byte) []byte { b[20] ^= 0x10; return b }},
		{"bit flip in epoch", func(b []byte) []byte { b[9] ^= 0x01; return b }},
		{"bit flip in crc", func(b []byte) []byte { b[61] ^= 0x80; return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.mut(bytes.Clone(good))
			if _, err := DecodeSlotHeader(b); !errors.Is(err, ErrBadHeader) {
				t.Fatalf("decode: %v, want ErrBadHeader", err)
			}
		})
	}
}

// TestVerifySlot checks a slot's verification in each format version,
// with a payload of whole blocks (version 2 puts it one block in) and
// one of a ragged size (right after the header in both).
func TestVerifySlot(t *testing.T) {
	for _, geo := range []struct {
		version uint16
		pb      int64
		off     int64
	}{
		{1, 5000, HeaderSize}, {2, 5000, HeaderSize}, {1, 8192, HeaderSize}, {2, 8192, 4096},
	} {
		t.Run(fmt.Sprintf("v%d-%d", geo.version, geo.pb), func(t *testing.T) {
			if got := PayloadOffset(geo.version, geo.pb); got != geo.off {
				t.Fatalf("PayloadOffset(%d, %d) = %d, want %d", geo.version, geo.pb, got, geo.off)
			}
			verifySlotIn(t, geo.version, geo.pb, geo.off)
		})
	}
}

func verifySlotIn(t *testing.T, version uint16, pb, off int64) {
	h := sampleHeader()
	h.Version = version
	buf := make([]byte, SlotBytes(pb))
	if off+pb > int64(len(buf)) {
		t.Fatalf("payload at %d of %d bytes does not fit a slot of %d", off, pb, len(buf))
	}
	for i := off; i < off+pb; i++ {
		buf[i] = byte(i)
	}
	h.PayloadLen = uint32(pb)
	h.PayloadCRC = PayloadCRC(buf[off : off+pb])
	h.Encode(buf)
	if p, err := verifySlot(buf, h.Kind, h.Epoch, h.Hash, pb, version); err != nil || int64(len(p)) != pb {
		t.Fatalf("verify good slot: %v", err)
	}
	dst := make([]byte, pb)
	if sum, err := copyVerifiedSlot(dst, buf, h.Kind, h.Epoch, h.Hash, pb, version); err != nil || sum != h.PayloadCRC || !bytes.Equal(dst, buf[off:off+pb]) {
		t.Fatalf("copy out of a good slot: sum %#x (header %#x), %v", sum, h.PayloadCRC, err)
	}
	if sum, err := verifyInPlace(buf[:HeaderSize], bytes.Clone(buf[off:off+pb]), h.Kind, h.Epoch, h.Hash, version); err != nil || sum != h.PayloadCRC {
		t.Fatalf("verify in place: sum %#x (header %#x), %v", sum, h.PayloadCRC, err)
	}
	other := h.Hash
	other[0] ^= 1
	otherVersion := uint16(3) - version
	for _, tc := range []struct {
		name    string
		mut     func(b []byte)
		kind    uint8
		epoch   uint64
		hash    pagehash.Hash
		pb      int64
		version uint16
		want    error
	}{
		{"payload bit", func(b []byte) { b[off+100] ^= 4 }, h.Kind, h.Epoch, h.Hash, pb, version, ErrPayloadCorrupt},
		{"payload last byte", func(b []byte) { b[off+pb-1] ^= 1 }, h.Kind, h.Epoch, h.Hash, pb, version, ErrPayloadCorrupt},
		{"header bit", func(b []byte) { b[30] ^= 1 }, h.Kind, h.Epoch, h.Hash, pb, version, ErrBadHeader},
		{"other hash", func([]byte) {}, h.Kind, h.Epoch, other, pb, version, ErrSlotMismatch},
		{"other kind", func([]byte) {}, 0, h.Epoch, h.Hash, pb, version, ErrSlotMismatch},
		{"old epoch", func([]byte) {}, h.Kind, h.Epoch + 1<<16, h.Hash, pb, version, ErrSlotMismatch},
		{"other length", func([]byte) {}, h.Kind, h.Epoch, h.Hash, pb + 1, version, ErrSlotMismatch},
		{"a file of the other version", func([]byte) {}, h.Kind, h.Epoch, h.Hash, pb, otherVersion, ErrSlotMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := bytes.Clone(buf)
			tc.mut(b)
			if _, err := verifySlot(b, tc.kind, tc.epoch, tc.hash, tc.pb, tc.version); !errors.Is(err, tc.want) {
				t.Fatalf("verify: %v, want %v", err, tc.want)
			}
			if _, err := copyVerifiedSlot(make([]byte, tc.pb), b, tc.kind, tc.epoch, tc.hash, tc.pb, tc.version); !errors.Is(err, tc.want) {
				t.Fatalf("copy out: %v, want %v", err, tc.want)
			}
			if tc.pb != pb {
				return // in place, the payload's length is the span's
			}
			if _, err := verifyInPlace(b[:HeaderSize], b[off:off+pb], tc.kind, tc.epoch, tc.hash, tc.version); !errors.Is(err, tc.want) {
				t.Fatalf("verify in place: %v, want %v", err, tc.want)
			}
		})
	}
}

func TestSuperblockRoundTrip(t *testing.T) {
	want := superblock{Version: FormatVersion, Kind: 1, Rank: 3, PageBytes: 5000, SlotBytes: SlotBytes(5000), Slots: 77, Epoch: epochFor(9, 3), StackID: "stack-1"}
	b := make([]byte, superblockSize)
	old := want
	old.Version = minFormatVersion
	for _, sb := range []superblock{old, want} {
		if err := sb.encode(b); err != nil {
			t.Fatal(err)
		}
		got, err := decodeSuperblock(b)
		if err != nil || got != sb {
			t.Fatalf("decode = %+v, %v; want %+v", got, err, sb)
		}
	}
	for _, v := range []uint16{0, FormatVersion + 1} {
		c := bytes.Clone(b)
		binary.LittleEndian.PutUint16(c[8:], v)
		binary.LittleEndian.PutUint32(c[113:], PayloadCRC(c[:113]))
		if _, err := decodeSuperblock(c); !errors.Is(err, ErrBadSuperblock) {
			t.Fatalf("superblock of version %d: %v, want ErrBadSuperblock", v, err)
		}
	}
	b[40] ^= 1
	if _, err := decodeSuperblock(b); !errors.Is(err, ErrBadHeader) {
		t.Fatalf("flipped epoch: %v, want ErrBadHeader", err)
	}
	long := want
	long.StackID = string(make([]byte, maxStackID+1))
	if err := long.encode(b); err == nil {
		t.Fatal("encode of an over-long stack id succeeded")
	}
}

func TestSlotBytes(t *testing.T) {
	for _, tc := range []struct{ page, want int64 }{
		{1, 4096}, {4096 - HeaderSize, 4096}, {4096 - HeaderSize + 1, 8192},
		{2883584, 2883584 + 4096}, // 2.75 MiB
	} {
		if got := SlotBytes(tc.page); got != tc.want {
			t.Errorf("SlotBytes(%d) = %d, want %d", tc.page, got, tc.want)
		}
	}
}

// FuzzDecodeSlotHeader: the decoder never panics, and whatever it accepts
// re-encodes to the same 64 bytes.
func FuzzDecodeSlotHeader(f *testing.F) {
	good := make([]byte, HeaderSize)
	sampleHeader().Encode(good)
	f.Add(good)
	f.Add(make([]byte, HeaderSize))
	f.Add(good[:10])
	flipped := bytes.Clone(good)
	flipped[33] ^= 0x40
	f.Add(flipped)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeSlotHeader(b)
		if err != nil {
			if !errors.Is(err, ErrBadHeader) {
				t.Fatalf("error %v does not wrap ErrBadHeader", err)
			}
			return
		}
		out := make([]byte, HeaderSize)
		h.Encode(out)
		if !bytes.Equal(out, b[:HeaderSize]) {
			t.Fatalf("accepted header does not re-encode identically")
		}
	})
}

// FuzzDecodeSuperblock: never panics; accepted superblocks re-encode to
// the same bytes.
func FuzzDecodeSuperblock(f *testing.F) {
	b := make([]byte, superblockSize)
	_ = superblock{Kind: 0, Rank: 1, PageBytes: 100, SlotBytes: SlotBytes(100), Slots: 3, Epoch: 7, StackID: "x"}.encode(b)
	f.Add(b[:superEncodedLen])
	f.Add(make([]byte, superEncodedLen))
	f.Fuzz(func(t *testing.T, in []byte) {
		sb, err := decodeSuperblock(in)
		if err != nil {
			if !errors.Is(err, ErrBadHeader) {
				t.Fatalf("error %v does not wrap ErrBadHeader", err)
			}
			return
		}
		out := make([]byte, superEncodedLen)
		if err := sb.encode(out); err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if !bytes.Equal(out, in[:superEncodedLen]) {
			t.Fatalf("accepted superblock does not re-encode identically")
		}
	})
}

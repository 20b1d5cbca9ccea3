package l3disk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/kvtier/kvtier/internal/crc32c"
	"hash/crc32"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
)

// HeaderSize is the length of a slot header; the payload follows it.
const HeaderSize = 64

// FormatVersion is the on-disk format version of the slot headers and
// superblocks this build writes. It reads every version from
// minFormatVersion on and refuses any other.
//
// Version 2 (2026-12-06) moves the payload of a page whose size is a
// multiple of the O_DIRECT block to the slot's second block (the header
// keeps the first to itself), so that the page is written straight from
// the caller's slab span and read straight into it, with no staging copy.
// Other page sizes keep the payload right after the header, as in version
// 1. The slot's size is the same in both. A file keeps the version it was
// made with (a version 1 file is read and written as version 1) until it
// is recreated.
const FormatVersion = 2

// minFormatVersion is the oldest on-disk format this build reads.
const minFormatVersion = 1

// PayloadOffset returns where in its slot a page of pageBytes starts in
// a file of the given format version.
func PayloadOffset(version uint16, pageBytes int64) int64 {
	if version >= 2 && pageBytes%diskfs.BlockSize == 0 {
		return diskfs.BlockSize
	}
	return HeaderSize
}

const (
	slotMagic  = 0x334c564b // "KVL3" little-endian
	superMagic = "KVL3SLAB"
	// superblockSize is the space before slot 0 in a slab file.
	superblockSize = diskfs.BlockSize
)

// castagnoli is CRC-32C, the checksum of headers and payloads.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrBadHeader marks a slot header or superblock that fails to decode:
// wrong magic, version or checksum. For a slot it means "no valid page
// here" (never written, torn, or overwritten by something else).
var ErrBadHeader = errors.New("bad slot header")

// ErrBadSuperblock marks a slab superblock that fails to decode (wrong
// magic, version or checksum, inconsistent geometry). It matches
// ErrBadHeader too, so callers that treat both alike keep working; its
// message names the superblock, not a slot.
var ErrBadSuperblock error = badSuperblock{}

type badSuperblock struct{}

func (badSuperblock) Error() string        { return "bad superblock" }
func (badSuperblock) Is(target error) bool { return target == ErrBadHeader }

// SlotHeader is the self-describing 64-byte header at the start of every
// written slot:
//
//	off  size  field
//	  0     4  magic "KVL3"
//	  4     2  format version
//	  6     1  payload kind
//	  7     1  reserved (0)
//	  8     8  epoch
//	 16    32  page hash
//	 48     4  payload length
//	 52     4  payload CRC-32C
//	 56     4  reserved (0)
//	 60     4  header CRC-32C of bytes 0..59
//
// All integers are little-endian.
type SlotHeader struct {
	// Version is the format version; 0 encodes as FormatVersion.
	Version    uint16
	Kind       uint8
	Epoch      uint64
	Hash       pagehash.Hash
	PayloadLen uint32
	PayloadCRC uint32
}

// Encode writes h into dst[:HeaderSize].
func (h SlotHeader) Encode(dst []byte) {
	_ = dst[HeaderSize-1]
	v := h.Version
	if v == 0 {
		v = FormatVersion
	}
	binary.LittleEndian.PutUint32(dst[0:], slotMagic)
	binary.LittleEndian.PutUint16(dst[4:], v)
	dst[6] = h.Kind
	dst[7] = 0
	binary.LittleEndian.PutUint64(dst[8:], h.Epoch)
	copy(dst[16:48], h.Hash[:])
	binary.LittleEndian.PutUint32(dst[48:], h.PayloadLen)
	binary.LittleEndian.PutUint32(dst[52:], h.PayloadCRC)
	binary.LittleEndian.PutUint32(dst[56:], 0)
	binary.LittleEndian.PutUint32(dst[60:], crc32.Checksum(dst[:60], castagnoli))
}

// DecodeSlotHeader parses b[:HeaderSize]. Any error wraps ErrBadHeader.
func DecodeSlotHeader(b []byte) (SlotHeader, error) {
	var h SlotHeader
	if len(b) < HeaderSize {
		return h, fmt.Errorf("slot header: %d bytes, want %d: %w", len(b), HeaderSize, ErrBadHeader)
	}
	if m := binary.LittleEndian.Uint32(b[0:]); m != slotMagic {
		return h, fmt.Errorf("slot header: magic %#08x, want %#08x: %w", m, slotMagic, ErrBadHeader)
	}
	if got, want := binary.LittleEndian.Uint32(b[60:]), crc32.Checksum(b[:60], castagnoli); got != want {
		return h, fmt.Errorf("slot header: crc %#08x, computed %#08x: %w", got, want, ErrBadHeader)
	}
	v := binary.LittleEndian.Uint16(b[4:])
	if v < minFormatVersion || v > FormatVersion {
		return h, fmt.Errorf("slot header: format version %d, want %d..%d: %w", v, minFormatVersion, FormatVersion, ErrBadHeader)
	}
	h.Version = v
	if b[7] != 0 || binary.LittleEndian.Uint32(b[56:]) != 0 {
		return h, fmt.Errorf("slot header: reserved bytes set: %w", ErrBadHeader)
	}
	h.Kind = b[6]
	h.Epoch = binary.LittleEndian.Uint64(b[8:])
	copy(h.Hash[:], b[16:48])
	h.PayloadLen = binary.LittleEndian.Uint32(b[48:])
	h.PayloadCRC = binary.LittleEndian.Uint32(b[52:])
	return h, nil
}

// PayloadCRC returns the CRC-32C of a payload.
func PayloadCRC(p []byte) uint32 { return crc32c.Checksum(p) }

// SlotBytes returns the size of a slot holding a payload of pageBytes:
// header plus payload rounded up to the O_DIRECT block. It is the same in
// every format version (a version 2 payload of whole blocks starts one
// block in, where version 1's header would have pushed its last block).
func SlotBytes(pageBytes int64) int64 { return diskfs.RoundUp(HeaderSize + pageBytes) }

// superblock is block 0 of a slab file: what the file holds and the
// current epoch. It is rewritten (one aligned block, then fdatasync) only
// at create and at a cold-start "clear".
//
//	off  size  field
//	  0     8  magic "KVL3SLAB"
//	  8     2  format version
//	 10     1  payload kind
//	 11     1  reserved (0)
//	 12     4  rank
//	 16     8  page bytes
//	 24     8  slot bytes
//	 32     8  slots
//	 40     8  epoch
//	 48     1  stack id length n (<= 64)
//	 49    64  stack id (n bytes, rest 0)
//	113     4  CRC-32C of bytes 0..112
type superblock struct {
	// Version is the file's format version (0 encodes as FormatVersion):
	// its slot headers carry the same one.
	Version   uint16
	Kind      uint8
	Rank      uint32
	PageBytes int64
	SlotBytes int64
	Slots     int64
	Epoch     uint64
	StackID   string
}

const (
	superEncodedLen = 117
	maxStackID      = 64
)

func (s superblock) encode(dst []byte) error {
	if len(s.StackID) > maxStackID {
		return fmt.Errorf("superblock: stack id %q longer than %d bytes", s.StackID, maxStackID)
	}
	clear(dst[:superEncodedLen])
	v := s.Version
	if v == 0 {
		v = FormatVersion
	}
	copy(dst[0:8], superMagic)
	binary.LittleEndian.PutUint16(dst[8:], v)
	dst[10] = s.Kind
	binary.LittleEndian.PutUint32(dst[12:], s.Rank)
	binary.LittleEndian.PutUint64(dst[16:], uint64(s.PageBytes))
	binary.LittleEndian.PutUint64(dst[24:], uint64(s.SlotBytes))
	binary.LittleEndian.PutUint64(dst[32:], uint64(s.Slots))
	binary.LittleEndian.PutUint64(dst[40:], s.Epoch)
	dst[48] = byte(len(s.StackID))
	copy(dst[49:49+maxStackID], s.StackID)
	binary.LittleEndian.PutUint32(dst[113:], crc32.Checksum(dst[:113], castagnoli))
	return nil
}

func decodeSuperblock(b []byte) (superblock, error) {
	var s superblock
	if len(b) < superEncodedLen {
		return s, fmt.Errorf("superblock: %d bytes, want %d: %w", len(b), superEncodedLen, ErrBadSuperblock)
	}
	if string(b[0:8]) != superMagic {
		return s, fmt.Errorf("superblock: magic %q, want %q: %w", b[0:8], superMagic, ErrBadSuperblock)
	}
	if got, want := binary.LittleEndian.Uint32(b[113:]), crc32.Checksum(b[:113], castagnoli); got != want {
		return s, fmt.Errorf("superblock: crc %#08x, computed %#08x: %w", got, want, ErrBadSuperblock)
	}
	v := binary.LittleEndian.Uint16(b[8:])
	if v < minFormatVersion || v > FormatVersion {
		return s, fmt.Errorf("superblock: format version %d, want %d..%d: %w", v, minFormatVersion, FormatVersion, ErrBadSuperblock)
	}
	s.Version = v
	n := int(b[48])
	if n > maxStackID {
		return s, fmt.Errorf("superblock: stack id length %d > %d: %w", n, maxStackID, ErrBadSuperblock)
	}
	if b[11] != 0 || !allZero(b[49+n:49+maxStackID]) {
		return s, fmt.Errorf("superblock: reserved bytes set: %w", ErrBadSuperblock)
	}
	s.Kind = b[10]
	s.Rank = binary.LittleEndian.Uint32(b[12:])
	s.PageBytes = int64(binary.LittleEndian.Uint64(b[16:]))
	s.SlotBytes = int64(binary.LittleEndian.Uint64(b[24:]))
	s.Slots = int64(binary.LittleEndian.Uint64(b[32:]))
	s.Epoch = binary.LittleEndian.Uint64(b[40:])
	s.StackID = string(b[49 : 49+n])
	if s.PageBytes <= 0 || s.Slots < 0 || s.SlotBytes != SlotBytes(s.PageBytes) {
		return s, fmt.Errorf("superblock: page bytes %d, slot bytes %d, slots %d are inconsistent: %w",
			s.PageBytes, s.SlotBytes, s.Slots, ErrBadSuperblock)
	}
	return s, nil
}

package redis

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

// HeaderSize is the length of the header at the start of every value; the
// payload follows it.
const HeaderSize = 64

// FormatVersion is the value format version. A reader refuses any other.
const FormatVersion = 1

// valueMagic is "KVRD" little-endian.
const valueMagic = 0x4452564b

// castagnoli is CRC-32C, the checksum of headers and payloads.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrBadValue marks a value that is not the page it is read for: too short,
// wrong magic, version or header checksum, another page's hash or kind, a
// length that is not the page size, or a payload whose CRC-32C does not
// match. The store turns it into a counted corrupt miss.
var ErrBadValue = errors.New("bad value")

// Header is the self-describing 64-byte header at the start of every value:
//
//	off  size  field
//	  0     4  magic "KVRD"
//	  4     2  format version
//	  6     1  payload kind
//	  7     1  reserved (0)
//	  8    32  page hash
//	 40     8  payload length
//	 48     4  payload CRC-32C
//	 52     8  reserved (0)
//	 60     4  header CRC-32C of bytes 0..59
//
// All integers are little-endian.
type Header struct {
	// Kind is the payload kind.
	Kind tiers.PayloadKind
	// Hash is the page hash.
	Hash pagehash.Hash
	// Length is the payload length in bytes.
	Length uint64
	// PayloadCRC is the CRC-32C of the payload.
	PayloadCRC uint32
}

// Encode writes h into dst[:HeaderSize].
func (h Header) Encode(dst []byte) {
	_ = dst[HeaderSize-1]
	binary.LittleEndian.PutUint32(dst[0:], valueMagic)
	binary.LittleEndian.PutUint16(dst[4:], FormatVersion)
	dst[6] = byte(h.Kind)
	dst[7] = 0
	copy(dst[8:40], h.Hash[:])
	binary.LittleEndian.PutUint64(dst[40:], h.Length)
	binary.LittleEndian.PutUint32(dst[48:], h.PayloadCRC)
	binary.LittleEndian.PutUint64(dst[52:], 0)
	binary.LittleEndian.PutUint32(dst[60:], crc32.Checksum(dst[:60], castagnoli))
}

// DecodeHeader parses b[:HeaderSize]. Any error wraps ErrBadValue and says
// which field was wrong.
func DecodeHeader(b []byte) (Header, error) {
	var h Header
	if len(b) < HeaderSize {
		return h, fmt.Errorf("value header: %d bytes, want at least %d: %w", len(b), HeaderSize, ErrBadValue)
	}
	if m := binary.LittleEndian.Uint32(b[0:]); m != valueMagic {
		return h, fmt.Errorf("value header: magic %#08x, want %#08x: %w", m, valueMagic, ErrBadValue)
	}
	if got, want := binary.LittleEndian.Uint32(b[60:]), crc32.Checksum(b[:60], castagnoli); got != want {
		return h, fmt.Errorf("value header: crc %#08x, computed %#08x: %w", got, want, ErrBadValue)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != FormatVersion {
		return h, fmt.Errorf("value header: format version %d, want %d: %w", v, FormatVersion, ErrBadValue)
	}
	if b[7] != 0 || binary.LittleEndian.Uint64(b[52:]) != 0 {
		return h, fmt.Errorf("value header: reserved bytes set: %w", ErrBadValue)
	}
	h.Kind = tiers.PayloadKind(b[6])
	copy(h.Hash[:], b[8:40])
	h.Length = binary.LittleEndian.Uint64(b[40:])
	h.PayloadCRC = binary.LittleEndian.Uint32(b[48:])
	return h, nil
}

// VerifyValue checks that value is the page key with a payload of exactly
// pageBytes bytes, and returns the payload (aliasing value). Any error
// wraps ErrBadValue.
func VerifyValue(value []byte, key tiers.Key, pageBytes int64) ([]byte, error) {
	h, err := DecodeHeader(value)
	if err != nil {
		return nil, err
	}
	if h.Kind != key.Kind {
		return nil, fmt.Errorf("value header: payload kind %d, want %d: %w", h.Kind, key.Kind, ErrBadValue)
	}
	if h.Hash != key.Hash {
		return nil, fmt.Errorf("value header: page hash %s, want %s: %w", h.Hash.Short(), key.Hash.Short(), ErrBadValue)
	}
	if pageBytes < 0 || h.Length != uint64(pageBytes) {
		return nil, fmt.Errorf("value header: payload length %d, want page_bytes %d: %w", h.Length, pageBytes, ErrBadValue)
	}
	payload := value[HeaderSize:]
	if uint64(len(payload)) != h.Length {
		return nil, fmt.Errorf("value: %d payload bytes after the header, header says %d: %w", len(payload), h.Length, ErrBadValue)
	}
	if got := crc32.Checksum(payload, castagnoli); got != h.PayloadCRC {
		return nil, fmt.Errorf("value payload: crc %#08x, header says %#08x: %w", got, h.PayloadCRC, ErrBadValue)
	}
	return payload, nil
}

// gatherChunk bounds one step of the fused copy and checksum in
// EncodeValue: small enough that the copied bytes are still in cache when
// the checksum reads them.
const gatherChunk = 64 << 10

// EncodeValue writes the value of page key with payload src into dst,
// which must hold HeaderSize+len(src) bytes, and returns dst. It copies and
// checksums in one pass over src.
func EncodeValue(dst []byte, key tiers.Key, src []byte) []byte {
	dst = dst[:HeaderSize+len(src)]
	body := dst[HeaderSize:]
	var crc uint32
	for off := 0; off < len(src); off += gatherChunk {
		end := min(off+gatherChunk, len(src))
		copy(body[off:end], src[off:end])
		// NB: checksum the copy, not the slab: it is what goes on the wire,
		// and it is hot in cache.
		crc = crc32.Update(crc, castagnoli, body[off:end])
	}
	Header{Kind: key.Kind, Hash: key.Hash, Length: uint64(len(src)), PayloadCRC: crc}.Encode(dst)
	return dst
}

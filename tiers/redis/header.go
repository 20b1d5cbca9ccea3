package redis

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/kvtier/kvtier/internal/crc32c"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

// TrailerSize is the length of the trailer at the end of every value; the
// payload comes before it.
const TrailerSize = 64

// FormatVersion is the value format version. A reader refuses any other.
//
// Version 1 put a 64-byte header before the payload. Version 2 moves the
// same fields to the end, so that a put can send the payload straight from
// the slab (SET) and the small trailer after it (APPEND, in one MULTI/EXEC)
// without first copying both into one buffer. A version 1 value is refused
// with an error that names it (a counted corrupt miss; the next put of the
// page rewrites it).
const FormatVersion = 2

// valueMagic is "KVRD" little-endian.
const valueMagic = 0x4452564b

// castagnoli is CRC-32C, the checksum of trailers (payloads go through
// crc32c, the same function, faster).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrBadValue marks a value that is not the page it is read for: too short,
// wrong magic, version or trailer checksum, another page's hash or kind, a
// length that is not the page size, or a payload whose CRC-32C does not
// match. The store turns it into a counted corrupt miss.
var ErrBadValue = errors.New("bad value")

// Trailer is the self-describing 64-byte trailer at the end of every value
// (format version 2):
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
//	 60     4  trailer CRC-32C of bytes 0..59
//
// Offsets are within the trailer; all integers are little-endian.
type Trailer struct {
	// Kind is the payload kind.
	Kind tiers.PayloadKind
	// Hash is the page hash.
	Hash pagehash.Hash
	// Length is the payload length in bytes.
	Length uint64
	// PayloadCRC is the CRC-32C of the payload.
	PayloadCRC uint32
}

// Encode writes t into dst[:TrailerSize].
func (t Trailer) Encode(dst []byte) {
	encodeFields(dst, FormatVersion, t)
}

func encodeFields(dst []byte, version uint16, t Trailer) {
	_ = dst[TrailerSize-1]
	binary.LittleEndian.PutUint32(dst[0:], valueMagic)
	binary.LittleEndian.PutUint16(dst[4:], version)
	dst[6] = byte(t.Kind)
	dst[7] = 0
	copy(dst[8:40], t.Hash[:])
	binary.LittleEndian.PutUint64(dst[40:], t.Length)
	binary.LittleEndian.PutUint32(dst[48:], t.PayloadCRC)
	binary.LittleEndian.PutUint64(dst[52:], 0)
	binary.LittleEndian.PutUint32(dst[60:], crc32.Checksum(dst[:60], castagnoli))
}

// DecodeTrailer parses the last TrailerSize bytes of value. Any error wraps
// ErrBadValue and says which field was wrong; a value in the old format
// (version 1, header first) is named as such.
func DecodeTrailer(value []byte) (Trailer, error) {
	var t Trailer
	if len(value) < TrailerSize {
		return t, fmt.Errorf("value trailer: %d bytes, want at least %d: %w", len(value), TrailerSize, ErrBadValue)
	}
	b := value[len(value)-TrailerSize:]
	if m := binary.LittleEndian.Uint32(b[0:]); m != valueMagic {
		if isVersion1(value) {
			return t, errVersion1
		}
		return t, fmt.Errorf("value trailer: magic %#08x, want %#08x: %w", m, valueMagic, ErrBadValue)
	}
	if got, want := binary.LittleEndian.Uint32(b[60:]), crc32.Checksum(b[:60], castagnoli); got != want {
		if isVersion1(value) {
			return t, errVersion1
		}
		return t, fmt.Errorf("value trailer: crc %#08x, computed %#08x: %w", got, want, ErrBadValue)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != FormatVersion {
		return t, fmt.Errorf("value trailer: format version %d, want %d: %w", v, FormatVersion, ErrBadValue)
	}
	if b[7] != 0 || binary.LittleEndian.Uint64(b[52:]) != 0 {
		return t, fmt.Errorf("value trailer: reserved bytes set: %w", ErrBadValue)
	}
	t.Kind = tiers.PayloadKind(b[6])
	copy(t.Hash[:], b[8:40])
	t.Length = binary.LittleEndian.Uint64(b[40:])
	t.PayloadCRC = binary.LittleEndian.Uint32(b[48:])
	return t, nil
}

var errVersion1 = fmt.Errorf("value in format version 1 (64-byte header first), written by an older kvtier; this one reads version %d only: %w",
	FormatVersion, ErrBadValue)

// isVersion1 reports whether value starts with a well-formed version 1
// header (magic, version 1, header CRC-32C). Only used to name the error of
// a value whose trailer is not valid.
func isVersion1(value []byte) bool {
	if len(value) < TrailerSize {
		return false
	}
	b := value[:TrailerSize]
	return binary.LittleEndian.Uint32(b[0:]) == valueMagic && binary.LittleEndian.Uint16(b[4:]) == 1 &&
		binary.LittleEndian.Uint32(b[60:]) == crc32.Checksum(b[:60], castagnoli)
}

// VerifyValue checks that value is the page key with a payload of exactly
// pageBytes bytes, and returns the payload (aliasing value). Any error
// wraps ErrBadValue.
func VerifyValue(value []byte, key tiers.Key, pageBytes int64) ([]byte, error) {
	t, err := DecodeTrailer(value)
	if err != nil {
		if int64(len(value)) == pageBytes && !errors.Is(err, errVersion1) {
			return nil, fmt.Errorf("value of exactly page_bytes %d with no trailer (a put between its SET and its APPEND, or cut short there): %w", pageBytes, err)
		}
		return nil, err
	}
	if t.Kind != key.Kind {
		return nil, fmt.Errorf("value trailer: payload kind %d, want %d: %w", t.Kind, key.Kind, ErrBadValue)
	}
	if t.Hash != key.Hash {
		return nil, fmt.Errorf("value trailer: page hash %s, want %s: %w", t.Hash.Short(), key.Hash.Short(), ErrBadValue)
	}
	if pageBytes < 0 || t.Length != uint64(pageBytes) {
		return nil, fmt.Errorf("value trailer: payload length %d, want page_bytes %d: %w", t.Length, pageBytes, ErrBadValue)
	}
	payload := value[:len(value)-TrailerSize]
	if uint64(len(payload)) != t.Length {
		return nil, fmt.Errorf("value: %d payload bytes before the trailer, trailer says %d: %w", len(payload), t.Length, ErrBadValue)
	}
	if got := crc32c.Checksum(payload); got != t.PayloadCRC {
		return nil, fmt.Errorf("value payload: crc %#08x, trailer says %#08x: %w", got, t.PayloadCRC, ErrBadValue)
	}
	return payload, nil
}

// NewTrailer returns the trailer of page key with payload src, checksumming
// src.
func NewTrailer(key tiers.Key, src []byte) [TrailerSize]byte {
	var b [TrailerSize]byte
	Trailer{Kind: key.Kind, Hash: key.Hash, Length: uint64(len(src)), PayloadCRC: crc32c.Checksum(src)}.Encode(b[:])
	return b
}

// EncodeValue writes the whole value of page key with payload src into dst,
// which must hold len(src)+TrailerSize bytes, and returns dst. The store
// never builds a value in one buffer (it sends the payload from the slab
// and the trailer after it); tests and tools do.
func EncodeValue(dst []byte, key tiers.Key, src []byte) []byte {
	dst = dst[:len(src)+TrailerSize]
	copy(dst, src)
	t := NewTrailer(key, src)
	copy(dst[len(src):], t[:])
	return dst
}

// encodeVersion1 writes a value in the old format (header first), for the
// tests of its refusal.
func encodeVersion1(dst []byte, key tiers.Key, src []byte) []byte {
	dst = dst[:TrailerSize+len(src)]
	copy(dst[TrailerSize:], src)
	encodeFields(dst, 1, Trailer{Kind: key.Kind, Hash: key.Hash, Length: uint64(len(src)), PayloadCRC: crc32.Checksum(src, castagnoli)})
	return dst
}

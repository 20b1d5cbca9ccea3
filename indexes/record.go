package indexes

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// RecordSize is the length of an encoded record.
const RecordSize = 32

// RecordVersion is the format version written in byte 0 of every encoded
// record. A new layout is a new version; decoders refuse versions they do
// not know (as corrupt, so the entry is treated as absent).
const RecordVersion = 1

// castagnoli is the CRC-32C table; a read-only value computed once.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// The canonical record layout shared by every index implementation, all
// integers little-endian:
//
//	[0]      version (RecordVersion)
//	[1]      payload kind
//	[2:4]    disk
//	[4:12]   slot
//	[12:20]  epoch
//	[20:28]  last access
//	[28:32]  CRC-32C of bytes [0:28], XORed with the key's fold
//
// The key's fold is a 32-bit mix of the page hash and the kind (keyFold).
// NB: folding the key into the check value means a record that ends up
// under another key (a torn page of the underlying store, a bug that copies
// values) fails to decode — unless the two keys fold alike, about one
// chance in 2^32 — instead of pointing a key at another page's slot. The
// fold costs four multiplies where a CRC over the key would double the
// checksum work of every lookup.
const (
	recOffVersion = 0
	recOffKind    = 1
	recOffDisk    = 2
	recOffSlot    = 4
	recOffEpoch   = 12
	recOffAccess  = 20
	recOffCRC     = 28
)

// EncodeRecord writes r, stored under k, in the canonical record layout.
func EncodeRecord(dst *[RecordSize]byte, k Key, r Record) {
	dst[recOffVersion] = RecordVersion
	dst[recOffKind] = r.Kind
	binary.LittleEndian.PutUint16(dst[recOffDisk:], r.Disk)
	binary.LittleEndian.PutUint64(dst[recOffSlot:], r.Slot)
	binary.LittleEndian.PutUint64(dst[recOffEpoch:], r.Epoch)
	binary.LittleEndian.PutUint64(dst[recOffAccess:], r.LastAccess)
	binary.LittleEndian.PutUint32(dst[recOffCRC:], checkValue(&k, dst[:recOffCRC]))
}

// DecodeRecord decodes b, the value stored under k. Any failure (length,
// version, checksum) wraps ErrCorrupt and names the key.
func DecodeRecord(k Key, b []byte) (Record, error) {
	// NB: the error paths live in recordError so that this function stays
	// small; it runs once per key of every lookup.
	if len(b) != RecordSize || b[recOffVersion] != RecordVersion ||
		binary.LittleEndian.Uint32(b[recOffCRC:]) != checkValue(&k, b[:recOffCRC]) {
		return Record{}, recordError(k, b)
	}
	return Record{
		Kind:       b[recOffKind],
		Disk:       binary.LittleEndian.Uint16(b[recOffDisk:]),
		Slot:       binary.LittleEndian.Uint64(b[recOffSlot:]),
		Epoch:      binary.LittleEndian.Uint64(b[recOffEpoch:]),
		LastAccess: binary.LittleEndian.Uint64(b[recOffAccess:]),
	}, nil
}

// recordError explains why b, stored under k, does not decode.
func recordError(k Key, b []byte) error {
	switch {
	case len(b) != RecordSize:
		return fmt.Errorf("index record for key %s: want %d bytes, got %d: %w", k, RecordSize, len(b), ErrCorrupt)
	case b[recOffVersion] != RecordVersion:
		return fmt.Errorf("index record for key %s: format version %d, want %d: %w", k, b[recOffVersion], RecordVersion, ErrCorrupt)
	}
	return fmt.Errorf("index record for key %s: check value %08x, stored %08x: %w",
		k, checkValue(&k, b[:recOffCRC]), binary.LittleEndian.Uint32(b[recOffCRC:]), ErrCorrupt)
}

// SameLocation reports whether r and o name the same stored bytes: the same
// disk, slot and epoch. It is the condition of DeleteIf.
func (r Record) SameLocation(o Record) bool {
	return r.Disk == o.Disk && r.Slot == o.Slot && r.Epoch == o.Epoch
}

// checkValue is the CRC-32C of body XORed with the fold of k.
func checkValue(k *Key, body []byte) uint32 {
	return crc32.Update(0, castagnoli, body) ^ keyFold(k)
}

// keyFold mixes k into 32 bits: each 64-bit word of the hash, then the
// kind, is absorbed by an xor-multiply-xorshift step (the golden-ratio
// multiplier), so that structured keys — hashes that differ in a pattern,
// not at random — fold apart too.
func keyFold(k *Key) uint32 {
	// NB: each step is a bijection of the state, so two keys that agree
	// up to a word and differ in it are apart after that step.
	absorb := func(f, w uint64) uint64 {
		f = (f ^ w) * 0x9e3779b97f4a7c15
		return f ^ f>>29
	}
	f := uint64(0x6b76746965722d6b) // any nonzero start
	for i := 0; i < len(k.Hash); i += 8 {
		f = absorb(f, binary.LittleEndian.Uint64(k.Hash[i:]))
	}
	f = absorb(f, uint64(k.Kind))
	return uint32(f ^ f>>32)
}

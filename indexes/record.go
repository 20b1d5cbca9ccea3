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
//	[28:32]  CRC-32C of the encoded key followed by bytes [0:28]
//
// NB: the CRC covers the key as well as the record, so a record that ends up
// under another key (a torn page of the underlying store, a bug that copies
// values) fails to decode instead of pointing a key at another page's slot.
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
// Implementations that already hold the encoded key use EncodeRecordKeyed,
// which does not copy the key.
func EncodeRecord(dst *[RecordSize]byte, k Key, r Record) {
	var kb [KeySize]byte
	EncodeKey(&kb, k)
	EncodeRecordKeyed(dst, &kb, r)
}

// EncodeRecordKeyed writes r, stored under the encoded key kb, in the
// canonical record layout.
func EncodeRecordKeyed(dst *[RecordSize]byte, kb *[KeySize]byte, r Record) {
	dst[recOffVersion] = RecordVersion
	dst[recOffKind] = r.Kind
	binary.LittleEndian.PutUint16(dst[recOffDisk:], r.Disk)
	binary.LittleEndian.PutUint64(dst[recOffSlot:], r.Slot)
	binary.LittleEndian.PutUint64(dst[recOffEpoch:], r.Epoch)
	binary.LittleEndian.PutUint64(dst[recOffAccess:], r.LastAccess)
	binary.LittleEndian.PutUint32(dst[recOffCRC:], recordCRC(kb[:], dst[:recOffCRC]))
}

// DecodeRecord decodes b, the value stored under k. Any failure (length,
// version, checksum) wraps ErrCorrupt and names the key. Implementations
// that already hold the encoded key use DecodeRecordKeyed.
func DecodeRecord(k Key, b []byte) (Record, error) {
	var kb [KeySize]byte
	EncodeKey(&kb, k)
	return DecodeRecordKeyed(kb[:], b)
}

// DecodeRecordKeyed decodes b, the value stored under the encoded key kb.
// Any failure (key length, record length, version, checksum) wraps
// ErrCorrupt and names the key.
func DecodeRecordKeyed(kb, b []byte) (Record, error) {
	k, err := DecodeKey(kb)
	if err != nil {
		return Record{}, fmt.Errorf("index record under key %x: %w", kb, err)
	}
	if len(b) != RecordSize {
		return Record{}, fmt.Errorf("index record for key %s: want %d bytes, got %d: %w", k, RecordSize, len(b), ErrCorrupt)
	}
	if v := b[recOffVersion]; v != RecordVersion {
		return Record{}, fmt.Errorf("index record for key %s: format version %d, want %d: %w", k, v, RecordVersion, ErrCorrupt)
	}
	want := binary.LittleEndian.Uint32(b[recOffCRC:])
	if got := recordCRC(kb, b[:recOffCRC]); got != want {
		return Record{}, fmt.Errorf("index record for key %s: crc32c %08x, stored %08x: %w", k, got, want, ErrCorrupt)
	}
	return Record{
		Kind:       b[recOffKind],
		Disk:       binary.LittleEndian.Uint16(b[recOffDisk:]),
		Slot:       binary.LittleEndian.Uint64(b[recOffSlot:]),
		Epoch:      binary.LittleEndian.Uint64(b[recOffEpoch:]),
		LastAccess: binary.LittleEndian.Uint64(b[recOffAccess:]),
	}, nil
}

// SameLocation reports whether r and o name the same stored bytes: the same
// disk, slot and epoch. It is the condition of DeleteIf.
func (r Record) SameLocation(o Record) bool {
	return r.Disk == o.Disk && r.Slot == o.Slot && r.Epoch == o.Epoch
}

func recordCRC(kb, body []byte) uint32 {
	return crc32.Update(crc32.Update(0, castagnoli, kb), castagnoli, body)
}

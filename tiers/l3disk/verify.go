package l3disk

import (
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/internal/crc32c"
	"github.com/kvtier/kvtier/pagehash"
)

// ErrSlotMismatch marks a slot whose header is valid but describes another
// page than the one asked for (a reused slot, a stale epoch, another kind).
var ErrSlotMismatch = errors.New("slot holds another page")

// ErrPayloadCorrupt marks a slot whose payload fails its CRC (a torn write
// or bit rot).
var ErrPayloadCorrupt = errors.New("slot payload corrupt")

// slotPayload decodes buf's header (a whole slot of a file of the given
// format version), checks it against what the index promises, and
// returns it with the payload's bytes (their CRC not yet checked).
func slotPayload(buf []byte, kind uint8, epoch uint64, hash pagehash.Hash, pageBytes int64, version uint16) (SlotHeader, []byte, error) {
	h, err := DecodeSlotHeader(buf)
	if err != nil {
		return h, nil, err
	}
	if err := matchHeader(h, kind, epoch, hash, pageBytes, version); err != nil {
		return h, nil, err
	}
	off := PayloadOffset(version, pageBytes)
	if int64(len(buf)) < off+pageBytes {
		return h, nil, fmt.Errorf("slot buffer of %d bytes holds no %d-byte payload at %d: %w", len(buf), pageBytes, off, ErrPayloadCorrupt)
	}
	return h, buf[off : off+pageBytes], nil
}

// verifySlot checks that buf (a whole slot of a file of the given format
// version) holds page hash of kind at epoch with a payload of pageBytes
// whose CRC matches. It returns the payload on success.
func verifySlot(buf []byte, kind uint8, epoch uint64, hash pagehash.Hash, pageBytes int64, version uint16) ([]byte, error) {
	h, p, err := slotPayload(buf, kind, epoch, hash, pageBytes, version)
	if err != nil {
		return nil, err
	}
	if got := PayloadCRC(p); got != h.PayloadCRC {
		return nil, fmt.Errorf("payload crc %#08x, header says %#08x: %w", got, h.PayloadCRC, ErrPayloadCorrupt)
	}
	return p, nil
}

// copyVerifiedSlot is verifySlot that also copies the payload into dst
// (at least pageBytes long) in the same pass as its CRC, and returns the
// CRC. On an error dst holds unverified bytes (GetRequest.Dst is then
// unspecified).
func copyVerifiedSlot(dst, buf []byte, kind uint8, epoch uint64, hash pagehash.Hash, pageBytes int64, version uint16) (uint32, error) {
	h, p, err := slotPayload(buf, kind, epoch, hash, pageBytes, version)
	if err != nil {
		return 0, err
	}
	if got := crc32c.CopyUpdate(0, dst[:pageBytes], p); got != h.PayloadCRC {
		return 0, fmt.Errorf("payload crc %#08x, header says %#08x: %w", got, h.PayloadCRC, ErrPayloadCorrupt)
	}
	return h.PayloadCRC, nil
}

// verifyInPlace checks a slot read as its header block (hdr) and its
// payload p, read straight into the caller's memory: the header against
// what the index promises, p's CRC against the header's. It returns the
// CRC. On an error p holds unverified bytes.
func verifyInPlace(hdr, p []byte, kind uint8, epoch uint64, hash pagehash.Hash, version uint16) (uint32, error) {
	h, err := DecodeSlotHeader(hdr)
	if err != nil {
		return 0, err
	}
	if err := matchHeader(h, kind, epoch, hash, int64(len(p)), version); err != nil {
		return 0, err
	}
	if got := PayloadCRC(p); got != h.PayloadCRC {
		return 0, fmt.Errorf("payload crc %#08x, header says %#08x: %w", got, h.PayloadCRC, ErrPayloadCorrupt)
	}
	return h.PayloadCRC, nil
}

// matchHeader checks a decoded header against what the index promises
// and the file it was read from (its format version).
func matchHeader(h SlotHeader, kind uint8, epoch uint64, hash pagehash.Hash, pageBytes int64, version uint16) error {
	switch {
	case h.Version != version:
		return fmt.Errorf("header format version %d, the file's is %d: %w", h.Version, version, ErrSlotMismatch)
	case h.Hash != hash:
		return fmt.Errorf("header hash %s, want %s: %w", h.Hash.Short(), hash.Short(), ErrSlotMismatch)
	case h.Kind != kind:
		return fmt.Errorf("header kind %d, want %d: %w", h.Kind, kind, ErrSlotMismatch)
	case h.Epoch != epoch:
		return fmt.Errorf("header epoch %#x, want %#x: %w", h.Epoch, epoch, ErrSlotMismatch)
	case int64(h.PayloadLen) != pageBytes:
		return fmt.Errorf("header payload length %d, want %d: %w", h.PayloadLen, pageBytes, ErrSlotMismatch)
	}
	return nil
}

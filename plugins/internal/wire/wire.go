// Package wire converts between kvtier's Go role types (tiers, indexes) and
// the messages of the plugin protocol (plugins/proto), and maps errors to
// result codes and gRPC status codes and back. Both the host and the SDK use
// it, so the two ends read the contract the same way.
//
// Decoders here validate everything a plugin or a host sends (hash length,
// kind range, enum values): a malformed message is an error, never a value
// read as a hit.
package wire

import (
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/pagehash"
)

// ErrMalformed marks a message that violates the protocol: a wrong-length
// hash, an unset or unknown enum value, a reply of the wrong length. The
// host treats a plugin that sends one as broken.
var ErrMalformed = errors.New("malformed plugin message")

// Hash decodes a 32-byte page hash.
func Hash(b []byte) (pagehash.Hash, error) {
	var h pagehash.Hash
	if len(b) != pagehash.Size {
		return h, fmt.Errorf("page hash of %d bytes, want %d: %w", len(b), pagehash.Size, ErrMalformed)
	}
	copy(h[:], b)
	return h, nil
}

// Kind checks a payload kind against the number of kinds (0 means any
// value that fits a byte).
func Kind(k uint32, kinds int) (uint8, error) {
	if k > 255 || (kinds > 0 && int(k) >= kinds) {
		return 0, fmt.Errorf("payload kind %d (stack has %d kinds): %w", k, kinds, ErrMalformed)
	}
	return uint8(k), nil
}

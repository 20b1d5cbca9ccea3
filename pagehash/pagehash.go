// Package pagehash computes the prefix-chained page hashes that key every
// content-addressed tier of kvtier.
//
// A page is page_tokens consecutive uint32 tokens. Its hash is
//
//	h[i] = SHA-256(h[i-1] || tokens of page i as little-endian uint32)
//
// with h[-1] the 32 zero bytes, so one hash names one position in one prefix.
// The definition is part of the public contract: engines in other languages
// compute the same keys from the test vectors in docs/page-hashes.md. This
// package must never change the byte layout it hashes.
package pagehash

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// Size is the length of a page hash in bytes.
const Size = sha256.Size

// Hash is the prefix-chained SHA-256 of one page.
type Hash [Size]byte

// Root is h[-1], the hash that precedes the first page of every sequence.
var Root Hash

// String returns the lowercase hex form of h.
func (h Hash) String() string { return hex.EncodeToString(h[:]) }

// Short returns the first 8 bytes of h in hex, for logs.
func (h Hash) Short() string { return hex.EncodeToString(h[:8]) }

// Parse decodes a 64-character hex string into a Hash.
func Parse(s string) (Hash, error) {
	var h Hash
	if len(s) != 2*Size {
		return h, fmt.Errorf("page hash %q: want %d hex characters, got %d", s, 2*Size, len(s))
	}
	if _, err := hex.Decode(h[:], []byte(s)); err != nil {
		return h, fmt.Errorf("page hash %q: %w", s, err)
	}
	return h, nil
}

// Next returns the hash of the page holding tokens, chained after prev.
func Next(prev Hash, tokens []uint32) Hash {
	d := sha256.New()
	d.Write(prev[:])
	var buf [4 * 256]byte
	for len(tokens) > 0 {
		n := min(len(tokens), len(buf)/4)
		for i, t := range tokens[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], t)
		}
		d.Write(buf[:4*n])
		tokens = tokens[n:]
	}
	var h Hash
	d.Sum(h[:0])
	return h
}

// Chain appends to dst the hashes of the whole pages of tokens, chained
// after prev, and returns the extended slice. A trailing partial page is not
// hashed: only whole pages are ever cached.
func Chain(dst []Hash, prev Hash, tokens []uint32, pageTokens int) []Hash {
	if pageTokens <= 0 {
		panic(fmt.Sprintf("pagehash: page_tokens must be positive, got %d", pageTokens))
	}
	for len(tokens) >= pageTokens {
		prev = Next(prev, tokens[:pageTokens])
		dst = append(dst, prev)
		tokens = tokens[pageTokens:]
	}
	return dst
}

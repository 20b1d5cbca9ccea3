// Package nsdigest is the encoding both of serve's doors key a namespace
// by: SHA-256 over a version string and the namespace's fields, each
// string length-prefixed and each number 8 bytes little-endian, so two
// namespaces that differ in any field (or only in where a string ends)
// get different digests. Each door keeps its own field list and version
// string; this package keeps the encoding and the bound on field sizes.
package nsdigest

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
)

// MaxString bounds a namespace's strings: generous, but a client cannot
// make serve hash or log megabytes.
const MaxString = 256

// Writer accumulates one namespace's digest.
type Writer struct {
	h hash.Hash
	b [8]byte
}

// New starts a digest under version (e.g. "kvtier.namespace.v1").
func New(version string) *Writer {
	w := &Writer{h: sha256.New()}
	w.Str(version)
	return w
}

// Str adds a length-prefixed string.
func (w *Writer) Str(s string) {
	w.Num(uint64(len(s)))
	w.h.Write([]byte(s))
}

// Num adds a number.
func (w *Writer) Num(v uint64) {
	binary.LittleEndian.PutUint64(w.b[:], v)
	w.h.Write(w.b[:])
}

// Sum returns the digest.
func (w *Writer) Sum() [32]byte {
	var id [32]byte
	w.h.Sum(id[:0])
	return id
}

// Field is a namespace string field by its name in the API.
type Field struct{ Name, Value string }

// CheckStrings returns an error naming the first field over MaxString.
func CheckStrings(fields ...Field) error {
	for _, f := range fields {
		if len(f.Value) > MaxString {
			return fmt.Errorf("namespace.%s: %d bytes, at most %d", f.Name, len(f.Value), MaxString)
		}
	}
	return nil
}

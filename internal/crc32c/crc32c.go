// Package crc32c computes CRC-32C (Castagnoli), the checksum of the redis
// tier's values, as hash/crc32 with its Castagnoli table does, faster on
// amd64 with AVX-512 VPCLMULQDQ: hash/crc32 runs the SSE 4.2 CRC32
// instruction there (about 8 bytes a cycle), where carry-less folding of
// four 64-byte lanes at once runs several times faster. On a loaded 2-core
// machine the checksum of a put cost as much CPU as the socket write of
// the same bytes; it is the one pass over the payload the store adds to
// the raw client's.
package crc32c

import (
	"hash/crc32"
	"unsafe"
)

var table = crc32.MakeTable(crc32.Castagnoli)

// foldMin is the least length the folding path takes; shorter inputs go to
// hash/crc32.
const foldMin = 1024

// Checksum returns the CRC-32C of p.
func Checksum(p []byte) uint32 { return Update(0, p) }

// Update returns the CRC-32C of the bytes whose CRC-32C is crc followed by
// p, like crc32.Update with the Castagnoli table.
func Update(crc uint32, p []byte) uint32 {
	if !haveFold || len(p) < foldMin {
		return crc32.Update(crc, table, p)
	}
	n := len(p) &^ 63
	crc = ^fold(^crc, p[:n])
	return crc32.Update(crc, table, p[n:])
}

// CopyUpdate copies src into dst, as copy(dst, src) does when dst is at
// least as long, and returns Update(crc, src): the copy and the checksum
// in one pass over src, where a copy followed by Update reads it twice.
// It panics when dst is shorter than src.
func CopyUpdate(crc uint32, dst, src []byte) uint32 {
	if len(dst) < len(src) {
		panic("crc32c: CopyUpdate into a shorter dst")
	}
	if !haveFold || len(src) < foldMin || overlap(dst[:len(src)], src) {
		// NB: the sum first: with overlapping buffers the copy
		// overwrites part of src.
		crc = Update(crc, src)
		copy(dst, src)
		return crc
	}
	n := len(src) &^ 63
	crc = ^copyFold(^crc, dst[:n], src[:n])
	copy(dst[n:], src[n:])
	return crc32.Update(crc, table, src[n:])
}

// CopyUpdateStream is CopyUpdate with streaming (non-temporal) stores
// where the destination is 64-byte aligned: the destination is left out of
// the cache, as a copy into memory that is not read again soon should be,
// and the bytes are globally visible, in order with any later store, when
// it returns (it ends with a store fence).
func CopyUpdateStream(crc uint32, dst, src []byte) uint32 {
	if len(dst) < len(src) {
		panic("crc32c: CopyUpdateStream into a shorter dst")
	}
	if !haveFold || len(src) < foldMin || uintptr(unsafe.Pointer(unsafe.SliceData(dst)))&63 != 0 || overlap(dst[:len(src)], src) {
		return CopyUpdate(crc, dst, src)
	}
	n := len(src) &^ 63
	crc = ^copyFoldNT(^crc, dst[:n], src[:n])
	copy(dst[n:], src[n:])
	return crc32.Update(crc, table, src[n:])
}

// overlap reports whether a and b share a byte (the folding copy reads a
// block ahead of the one it writes).
func overlap(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}

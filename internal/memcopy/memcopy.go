// Package memcopy copies large byte ranges with non-temporal (streaming)
// stores: the destination's cache lines are written straight to memory
// instead of being read in first (no read-for-ownership) and left in the
// cache, which is what a copy into an L2 slab page that no CPU will read
// soon wants. Go's copy does this by itself only from about 1 MiB up; a
// gather or scatter of a page's per-layer slices (tens of KiB each) never
// reaches that size, and these kernels close the gap.
//
// Copy has copy's semantics for non-overlapping buffers and falls back to
// copy when they overlap, when the copy is small (below StreamThreshold)
// or when the CPU or build has no streaming kernel (non-amd64, or the
// purego build tag). GatherStrided and ScatterStrided move n equal slices
// between a strided and a contiguous layout as one batch that ends with a
// single store fence.
//
// The package must never be used for data the caller is about to read
// back: streamed bytes are evicted from the cache by design. It holds no
// mutable state: the kernel is chosen once, from the CPU's features, when
// the package is initialised.
package memcopy

import (
	"fmt"
	"unsafe"
)

const (
	// StreamThreshold is the smallest copy, in bytes (the total of a batch),
	// that Copy, GatherStrided and ScatterStrided stream; smaller ones use
	// copy, whose ordinary stores are cheaper when the bytes fit in cache.
	StreamThreshold = 16 << 10
	// MinStreamSlice is the smallest slice of a batch that is streamed;
	// below it the aligned head and tail done with ordinary stores are most
	// of the slice, and the batch uses copy.
	MinStreamSlice = 512

	// align is the destination alignment of the streamed body: a cache
	// line, so every streaming store fills whole lines of the CPU's
	// write-combining buffers.
	align = 64
	// unit is the byte count the assembly loop moves per iteration; the
	// streamed body is a multiple of it.
	unit = 128
)

// kernel is a streaming copy implementation.
type kernel struct {
	// name says which implementation it is.
	name string
	// body copies n bytes from src to dst with streaming stores; dst is
	// aligned to align bytes and n is a positive multiple of unit. It
	// issues no fence. Nil means the kernel cannot stream.
	body func(dst, src *byte, n int)
	// fence orders the streaming stores before every later store.
	fence func()
}

// plain is the kernel that never streams: every copy is Go's copy.
var plain = kernel{name: "copy"}

// Kernel names the copy implementation this process uses: "avx2", "sse2"
// or "copy" (no streaming kernel for this CPU or build).
func Kernel() string { return active.name }

// Copy copies min(len(dst), len(src)) bytes from src to dst and returns
// that count, as copy does. Large copies between non-overlapping buffers
// use streaming stores followed by a store fence, so the bytes are
// globally visible in order with any store after Copy returns; the
// destination is left out of the cache.
func Copy(dst, src []byte) int { return copyWith(&active, dst, src) }

// GatherStrided copies n slices of slice bytes from src, the i-th starting
// at i*stride, into dst, the i-th at i*slice, and returns n*slice. The
// batch ends with one store fence. It panics, as an out-of-range slice
// expression would, when n, slice or stride is negative or the buffers are
// too short: dst needs n*slice bytes, src (n-1)*stride+slice.
func GatherStrided(dst, src []byte, n, slice, stride int) int {
	return gatherWith(&active, dst, src, n, slice, stride)
}

// ScatterStrided is GatherStrided's inverse: it copies n slices of slice
// bytes from src, the i-th at i*slice, into dst, the i-th at i*stride, and
// returns n*slice. Slices are written in order, so with stride < slice a
// later slice overwrites the overlap of an earlier one, as a loop of copy
// calls would. It panics when the geometry does not fit the buffers.
func ScatterStrided(dst, src []byte, n, slice, stride int) int {
	return scatterWith(&active, dst, src, n, slice, stride)
}

func copyWith(k *kernel, dst, src []byte) int {
	n := min(len(dst), len(src))
	if n < StreamThreshold || k.body == nil || overlaps(dst[:n], src[:n]) {
		return copy(dst, src)
	}
	stream(k, dst[:n], src[:n])
	k.fence()
	return n
}

func gatherWith(k *kernel, dst, src []byte, n, slice, stride int) int {
	checkGeometry("gather", len(dst), len(src), n, slice, stride)
	if n == 0 || slice == 0 {
		return 0
	}
	total := n * slice
	srcSpan := src[:(n-1)*stride+slice]
	if !streams(k, total, slice) || overlaps(dst[:total], srcSpan) {
		for i := 0; i < n; i++ {
			copy(dst[i*slice:(i+1)*slice], src[i*stride:i*stride+slice])
		}
		return total
	}
	for i := 0; i < n; i++ {
		stream(k, dst[i*slice:(i+1)*slice], src[i*stride:i*stride+slice])
	}
	// NB: one fence for the batch. Should the goroutine move to another
	// thread between slices, the switch itself drains this CPU's
	// write-combining buffers (the scheduler's locked instructions and the
	// kernel's serialising return both do), so nothing is left unfenced.
	k.fence()
	return total
}

func scatterWith(k *kernel, dst, src []byte, n, slice, stride int) int {
	checkGeometry("scatter", len(src), len(dst), n, slice, stride)
	if n == 0 || slice == 0 {
		return 0
	}
	total := n * slice
	dstSpan := dst[:(n-1)*stride+slice]
	if !streams(k, total, slice) || overlaps(dstSpan, src[:total]) {
		for i := 0; i < n; i++ {
			copy(dst[i*stride:i*stride+slice], src[i*slice:(i+1)*slice])
		}
		return total
	}
	for i := 0; i < n; i++ {
		stream(k, dst[i*stride:i*stride+slice], src[i*slice:(i+1)*slice])
	}
	k.fence()
	return total
}

// streams reports whether a batch of total bytes in slices of slice bytes
// is worth streaming with k.
func streams(k *kernel, total, slice int) bool {
	return k.body != nil && total >= StreamThreshold && slice >= MinStreamSlice
}

// checkGeometry panics when a strided batch does not fit its buffers:
// contiguous is the length of the packed side, strided of the other.
func checkGeometry(op string, contiguous, strided, n, slice, stride int) {
	if n < 0 || slice < 0 || stride < 0 {
		panic(fmt.Sprintf("memcopy: %s of %d slices of %d bytes at stride %d: negative geometry", op, n, slice, stride))
	}
	if n == 0 || slice == 0 {
		return
	}
	// Compare by division so a huge n or stride cannot overflow; with
	// stride 0 every slice is the same bytes, which need only fit once.
	if slice > contiguous/n || slice > strided || (stride > 0 && n-1 > (strided-slice)/stride) {
		panic(fmt.Sprintf("memcopy: %s of %d slices of %d bytes at stride %d: contiguous side has %d bytes, strided side %d", op, n, slice, stride, contiguous, strided))
	}
}

// stream copies len(dst) == len(src) bytes: ordinary stores up to the
// first aligned destination byte, streaming stores for the aligned body,
// ordinary stores for the tail. It issues no fence.
func stream(k *kernel, dst, src []byte) {
	n := len(dst)
	head := int(-uintptr(unsafe.Pointer(unsafe.SliceData(dst))) & (align - 1))
	if head >= n {
		copy(dst, src)
		return
	}
	body := (n - head) &^ (unit - 1)
	copy(dst[:head], src[:head])
	if body > 0 {
		k.body(&dst[head], &src[head], body)
	}
	copy(dst[head+body:], src[head+body:n])
}

// overlaps reports whether a and b share any byte.
func overlaps(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}

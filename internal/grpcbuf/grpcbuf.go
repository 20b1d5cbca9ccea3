// Package grpcbuf is the buffer pool kvtier's gRPC servers and clients
// read and encode messages with: power-of-two tiers from 256 B to 16 MiB,
// a buffer cleared only over the length asked for.
//
// gRPC's default pool (grpc/mem.DefaultBufferPool) has tiers of 256 B,
// 4, 16 and 32 KiB and then 1 MiB, and clears a buffer's whole capacity
// at every Get: every message between 32 KiB and 1 MiB (an engine step's
// request or reply with a few dozen requests of a few dozen pages) took
// a 1 MiB buffer and cleared all of it, once to decode on the receiving
// side and once to encode on the sending side. Here such a message takes
// the next power of two and clears only its own length.
package grpcbuf

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
)

const (
	minShift = 8  // 256 B
	maxShift = 24 // 16 MiB; larger buffers are allocated and not pooled
)

// Pool is a mem.BufferPool with a tier per power of two.
type Pool struct {
	tiers [maxShift - minShift + 1]sync.Pool
}

var _ mem.BufferPool = (*Pool)(nil)

// Default is the pool the kvtier command installs as gRPC's default
// (cmd/kvtier) and its servers and clients name in their options.
var Default = &Pool{}

// shift is the tier of a buffer of length n: the smallest power of two
// that holds it, at least 1<<minShift.
func shift(n int) int {
	if n <= 1<<minShift {
		return minShift
	}
	return bits.Len(uint(n - 1))
}

// Get returns a buffer of length n, zero over its length, from the tier
// of n (its capacity that power of two), or a new one.
func (p *Pool) Get(n int) *[]byte {
	s := shift(n)
	if s > maxShift {
		b := make([]byte, n)
		return &b
	}
	if v, ok := p.tiers[s-minShift].Get().(*[]byte); ok {
		b := (*v)[:n]
		clear(b)
		*v = b
		return v
	}
	b := make([]byte, n, 1<<s)
	return &b
}

// Put keeps a buffer for a later Get when its capacity is one of the
// tiers' powers of two (a buffer from Get, or a prefix of one); any other
// buffer is left to the collector.
func (p *Pool) Put(b *[]byte) {
	c := cap(*b)
	if c < 1<<minShift || c > 1<<maxShift || c&(c-1) != 0 {
		return
	}
	*b = (*b)[:0]
	p.tiers[bits.Len(uint(c))-1-minShift].Put(b)
}

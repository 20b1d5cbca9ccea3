package grpcbuf

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/mem"
)

// TestGet: a buffer of the length asked for, zero over it even when the
// tier's buffer was returned dirty, its capacity the tier's power of two
// (none above the largest tier). Each size is asked for three times, its
// buffer dirtied over its whole capacity and put back in between.
func TestGet(t *testing.T) {
	cases := []struct {
		n, cap int
	}{
		{0, 256}, {1, 256}, {255, 256}, {256, 256}, {257, 512},
		{4096, 4096}, {4097, 8192}, {40 << 10, 64 << 10}, {33 << 10, 64 << 10},
		{1 << 20, 1 << 20}, {1<<20 + 1, 2 << 20}, {1 << maxShift, 1 << maxShift},
		{1<<maxShift + 1, 1<<maxShift + 1},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.n), func(t *testing.T) {
			p := &Pool{}
			for round := range 3 {
				b := p.Get(tc.n)
				if len(*b) != tc.n || cap(*b) != tc.cap {
					t.Fatalf("round %d: Get(%d): len %d cap %d, want len %d cap %d", round, tc.n, len(*b), cap(*b), tc.n, tc.cap)
				}
				for i, c := range *b {
					if c != 0 {
						t.Fatalf("round %d: Get(%d): byte %d is %#x, want 0", round, tc.n, i, c)
					}
				}
				// Dirty the whole capacity, then hand back a prefix.
				full := (*b)[:cap(*b)]
				for i := range full {
					full[i] = 0xA5
				}
				*b = (*b)[:min(tc.n, 3)]
				p.Put(b)
			}
		})
	}
}

// TestPutKeepsTiersOnly: buffers whose capacity is not a tier's power of
// two are not pooled; one that is serves a later Get of its tier.
func TestPutKeepsTiersOnly(t *testing.T) {
	p := &Pool{}
	for _, c := range []int{0, 1, 100, 1000, 3 << 10, 1<<maxShift + 1, 2 << maxShift} {
		b := make([]byte, 0, c)
		p.Put(&b)
	}
	for s := minShift; s <= 12; s++ {
		if v := p.tiers[s-minShift].Get(); v != nil {
			t.Errorf("tier %d holds a foreign buffer of capacity %d", s, cap(*v.(*[]byte)))
		}
	}
	// NB: sync.Pool may drop what it is given (it does at random under
	// the race detector), so the buffer back may be a new one.
	own := make([]byte, 10, 1<<12)
	p.Put(&own)
	if b := p.Get(3000); len(*b) != 3000 || cap(*b) != 1<<12 {
		t.Errorf("Get(3000) after a Put of a 4 KiB buffer: len %d capacity %d", len(*b), cap(*b))
	}
}

// BenchmarkGetPut: a Get and a Put of a message's buffer, this pool
// against gRPC's default (mem.DefaultBufferPool, the limit); the sizes
// of an engine step's messages.
func BenchmarkGetPut(b *testing.B) {
	for _, n := range []int{16 << 10, 40 << 10, 200 << 10} {
		for _, pc := range []struct {
			name string
			p    mem.BufferPool
		}{{"grpcbuf", &Pool{}}, {"grpc-default", mem.DefaultBufferPool()}} {
			b.Run(fmt.Sprintf("%s/%dKiB", pc.name, n>>10), func(b *testing.B) {
				b.SetBytes(int64(n))
				for b.Loop() {
					buf := pc.p.Get(n)
					(*buf)[n-1] = 1
					pc.p.Put(buf)
				}
			})
		}
	}
}

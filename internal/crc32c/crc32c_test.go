package crc32c

import (
	"bytes"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestMatchesHashCRC32 compares with hash/crc32 at every length around the
// folding path's thresholds and lane sizes, at several alignments and
// initial values.
func TestMatchesHashCRC32(t *testing.T) {
	t.Logf("folding path: %v", haveFold)
	r := rand.New(rand.NewPCG(14, 32))
	buf := make([]byte, 3<<20+300)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	lengths := []int{0, 1, 15, 63, 64, 255, 256, 257, 3 << 20, 2816 << 10, 2816<<10 + 64, 2816<<10 + 7}
	for n := foldMin - 130; n <= foldMin+600; n++ {
		lengths = append(lengths, n)
	}
	for n := 2048; n <= 2048+256; n += 16 {
		lengths = append(lengths, n)
	}
	for _, n := range lengths {
		for _, off := range []int{0, 1, 7, 64} {
			for _, init := range []uint32{0, 0xffffffff, r.Uint32()} {
				p := buf[off : off+n]
				if got, want := Update(init, p), crc32.Update(init, table, p); got != want {
					t.Fatalf("len %d off %d init %#x: %#08x, hash/crc32 %#08x", n, off, init, got, want)
				}
			}
		}
	}
	if got, want := Checksum(buf), crc32.Checksum(buf, table); got != want {
		t.Fatalf("Checksum: %#08x, want %#08x", got, want)
	}
}

// TestCopyUpdate: the copy is byte-exact, nothing past len(src) is
// written, and the checksum is hash/crc32's, at every length around the
// folding path's thresholds, at several source and destination
// alignments; overlapping buffers copy as copy does.
func TestCopyUpdate(t *testing.T) {
	seed := uint64(27)
	r := rand.New(rand.NewPCG(seed, 2))
	src := make([]byte, 3<<20+300)
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	dst := make([]byte, len(src)+200)
	lengths := []int{0, 1, 63, 64, 1023, 1024, 1025, 1088, 4096, 45056, 2816 << 10, 2816<<10 + 9}
	for n := foldMin - 70; n <= foldMin+300; n += 3 {
		lengths = append(lengths, n)
	}
	for _, n := range lengths {
		for _, so := range []int{0, 1, 64} {
			for _, do := range []int{0, 5, 64} {
				init := r.Uint32()
				for i := range dst {
					dst[i] = 0xA5
				}
				s := src[so : so+n]
				f := CopyUpdate
				if n%2 == 1 {
					f = CopyUpdateStream
				}
				got := f(init, dst[do:do+n+100], s)
				if want := crc32.Update(init, table, s); got != want {
					t.Fatalf("seed %d len %d src+%d dst+%d: sum %#08x, want %#08x", seed, n, so, do, got, want)
				}
				if !bytes.Equal(dst[do:do+n], s) {
					t.Fatalf("seed %d len %d src+%d dst+%d: copied bytes differ", seed, n, so, do)
				}
				for i, b := range dst[do+n : do+n+100] {
					if b != 0xA5 {
						t.Fatalf("seed %d len %d src+%d dst+%d: byte %d past the copy written", seed, n, so, do, i)
					}
				}
			}
		}
	}
	// Overlap: dst a few bytes into src, as copy handles it.
	buf := append([]byte(nil), src[:8192]...)
	want := append([]byte(nil), buf[:4096]...)
	sum := CopyUpdate(0, buf[100:], buf[:4096])
	if !bytes.Equal(buf[100:4196], want) || sum != crc32.Checksum(want, table) {
		t.Fatalf("overlapping CopyUpdate: copy or sum wrong")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("CopyUpdate into a shorter dst did not panic")
		}
	}()
	CopyUpdate(0, make([]byte, 10), make([]byte, 11))
}

// TestSingleBitChanges: a flipped bit anywhere in a page changes the
// checksum exactly as hash/crc32 says.
func TestSingleBitChanges(t *testing.T) {
	buf := make([]byte, 64<<10)
	base := Checksum(buf)
	for _, i := range []int{0, 1, 63, 64, 255, 256, 4095, 32768, len(buf) - 1} {
		buf[i] ^= 0x10
		if got, want := Checksum(buf), crc32.Checksum(buf, table); got != want || got == base {
			t.Fatalf("bit at %d: %#08x, want %#08x (unflipped %#08x)", i, got, want, base)
		}
		buf[i] ^= 0x10
	}
}

// FuzzUpdate: any input, any initial value, the same CRC as hash/crc32.
func FuzzUpdate(f *testing.F) {
	f.Add(uint32(0), make([]byte, 1024))
	f.Add(uint32(0xdeadbeef), make([]byte, 4097))
	f.Fuzz(func(t *testing.T, init uint32, p []byte) {
		if got, want := Update(init, p), crc32.Update(init, table, p); got != want {
			t.Fatalf("len %d init %#x: %#08x, hash/crc32 %#08x", len(p), init, got, want)
		}
	})
}

// FuzzCopyUpdate: any input, any offset into the destination, the bytes
// copied and hash/crc32's checksum.
func FuzzCopyUpdate(f *testing.F) {
	f.Add(uint32(0), uint8(0), make([]byte, 2048))
	f.Add(uint32(7), uint8(3), make([]byte, 1031))
	f.Fuzz(func(t *testing.T, init uint32, off uint8, p []byte) {
		dst := make([]byte, int(off)+len(p))
		f := CopyUpdate
		if off%2 == 0 {
			f = CopyUpdateStream
		}
		if got, want := f(init, dst[off:], p), crc32.Update(init, table, p); got != want || !bytes.Equal(dst[off:], p) {
			t.Fatalf("len %d off %d init %#x: %#08x, hash/crc32 %#08x (bytes equal %t)", len(p), off, init, got, want, bytes.Equal(dst[off:], p))
		}
	})
}

// BenchmarkCopyUpdate: one 2.75 MiB page copied and checksummed in one
// pass, against a copy then a checksum, against a copy alone (the limit).
func BenchmarkCopyUpdate(b *testing.B) {
	src := make([]byte, 2816<<10)
	for i := range src {
		src[i] = byte(i * 7)
	}
	// NB: 64 pages, so each round's destination is out of cache, as a
	// slab page is.
	dsts := make([][]byte, 64)
	for i := range dsts {
		dsts[i] = make([]byte, len(src))
		// Written once before any timing: a first write through fresh
		// memory pays a page fault a 4 KiB page (about 10 us on these
		// VMs), which a short -benchtime would measure instead of the
		// copy.
		copy(dsts[i], src)
	}
	i := 0
	next := func() []byte { i++; return dsts[i%len(dsts)] }
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			copy(next(), src)
		}
	})
	b.Run("copy-then-checksum", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			d := next()
			copy(d, src)
			Checksum(d)
		}
	})
	b.Run("copy-update", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			CopyUpdate(0, next(), src)
		}
	})
	b.Run("copy-update-stream", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			CopyUpdateStream(0, next(), src)
		}
	})
}

func BenchmarkChecksum(b *testing.B) {
	p := make([]byte, 2816<<10)
	for i := range p {
		p[i] = byte(i * 7)
	}
	b.Run("crc32c", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			Checksum(p)
		}
	})
	b.Run("hash-crc32", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			crc32.Checksum(p, table)
		}
	})
}

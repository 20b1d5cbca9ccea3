package crc32c

import (
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

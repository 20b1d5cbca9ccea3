package client

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkFirstWrite measures what docs/perf.md ("the engine's copies at
// the seed's geometry") reports: a copy into slab pages the process's
// mapping has not written yet, against the same copy into pages it has.
// The slab is a 64 MiB shm file, allocated (fallocate) and mapped as
// MapSlab maps it (MADV_POPULATE_WRITE included); only the copy pass is
// timed. Where "first" runs far below "again", the engine's first store
// into each slab page pays it (hugetlbfs avoids it).
func BenchmarkFirstWrite(b *testing.B) {
	const size = 64 << 20
	src := make([]byte, 2816<<10)
	for i := range src {
		src[i] = byte(i)
	}
	dir := "/dev/shm"
	if _, err := os.Stat(dir); err != nil {
		dir = b.TempDir()
	}
	mapFresh := func(b *testing.B) []byte {
		b.Helper()
		path := filepath.Join(dir, "kvtier-bench-firstwrite")
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		defer os.Remove(path)
		defer f.Close()
		if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
			b.Skipf("fallocate %s: %v", path, err)
		}
		m, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			b.Fatal(err)
		}
		_ = unix.Madvise(m, unix.MADV_POPULATE_WRITE)
		return m
	}
	pass := func(m []byte) {
		for off := 0; off+len(src) <= len(m); off += len(src) {
			copy(m[off:], src)
		}
	}
	for _, c := range []struct {
		name  string
		warms bool
	}{{"first", false}, {"again", true}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(size / int64(len(src)) * int64(len(src)))
			for b.Loop() {
				b.StopTimer()
				m := mapFresh(b)
				if c.warms {
					pass(m)
				}
				b.StartTimer()
				pass(m)
				b.StopTimer()
				if err := unix.Munmap(m); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

package pagestore

import (
	"runtime"
	"sync"

	"github.com/kvtier/kvtier/internal/crc32c"
)

// parallelCRCBytes: a batch of at least this many bytes is checksummed by
// several goroutines.
const parallelCRCBytes = 4 << 20

// forPages runs f(i) for i in [0, n), on several goroutines when the
// pages' bytes are many.
func (d *Door) forPages(n int, f func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), n)
	if workers <= 1 || int64(n)*d.pageBytes < parallelCRCBytes {
		for i := range n {
			f(i)
		}
		return
	}
	var wg sync.WaitGroup
	var next sync.Mutex
	at := 0
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next.Lock()
				i := at
				at++
				next.Unlock()
				if i >= n {
					return
				}
				f(i)
			}
		}()
	}
	wg.Wait()
}

// checksum returns slot's CRC32C per kind.
func (d *Door) checksum(slot int32) []uint32 {
	out := make([]uint32, len(d.kinds))
	for k := range d.kinds {
		out[k] = crc32c.Checksum(d.view(slot, k))
	}
	return out
}

// verify says whether slot's bytes still match crc.
func (d *Door) verify(slot int32, crc []uint32) bool {
	for k := range d.kinds {
		if crc32c.Checksum(d.view(slot, k)) != crc[k] {
			return false
		}
	}
	return true
}

package replay

import (
	"testing"

	"github.com/kvtier/kvtier/workload"
)

// FuzzReplay replays arbitrary (well-formed but possibly inconsistent)
// traces — ids repeated inside a request, the same id under different
// prefixes, requests longer than the capacity — through lru and belady at
// a small capacity: never a panic or an error, every block accounted for
// as a hit or a classified miss, and the tree never over capacity.
func FuzzReplay(f *testing.F) {
	f.Add([]byte{3, 1, 2, 3, 2, 1, 2, 4, 5, 6, 7, 8, 9, 1}, uint8(4))
	f.Add([]byte{2, 5, 5, 2, 5, 5, 1, 5}, uint8(1))
	f.Add([]byte{9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9}, uint8(3))
	reg := registry(f)
	f.Fuzz(func(t *testing.T, raw []byte, capBlocks uint8) {
		var reqs []workload.Request
		for len(raw) > 0 && len(reqs) < 64 {
			n := int(raw[0]%12) + 1
			raw = raw[1:]
			n = min(n, len(raw))
			if n == 0 {
				break
			}
			ids := make([]uint64, n)
			for i := range ids {
				ids[i] = uint64(raw[i] % 16)
			}
			raw = raw[n:]
			reqs = append(reqs, workload.Request{InputLength: n*512 - int(ids[0]), HashIDs: ids})
		}
		tr, err := Compile("fuzz", reqs)
		if err != nil {
			t.Fatal(err)
		}
		capacity := int64(capBlocks%16+1) * 512
		for _, name := range []string{"lru", "belady"} {
			ev, err := NewEvictor(reg, tr, Spec{Name: name})
			if err != nil {
				t.Fatal(err)
			}
			r, err := Run(tr, ev, capacity, nil)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if r.HitBlocks+r.Misses.Total() != int64(tr.Blocks()) {
				t.Fatalf("%s: %d hit + %d missed blocks, trace has %d", name, r.HitBlocks, r.Misses.Total(), tr.Blocks())
			}
			if int64(r.Pages) > r.CapacityBlocks {
				t.Fatalf("%s: %d pages over the capacity of %d", name, r.Pages, r.CapacityBlocks)
			}
		}
	})
}

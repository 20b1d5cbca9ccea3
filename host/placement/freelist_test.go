package placement

import (
	"math/rand/v2"
	"testing"
)

// TestFreeListBlocksMatchOracle runs small reservations and releases on a
// layout large enough for free lists of hundreds of ranges, so that blocks
// split, empty and merge (the property tests' layouts fit in one block),
// and checks the state against the oracle and the invariants throughout.
func TestFreeListBlocksMatchOracle(t *testing.T) {
	l := Layout{Kinds: []KindLayout{
		{Name: "kv", PageBytes: 4096, Regions: []Region{{Slab: 0, Pages: 700}, {Slab: 1, Pages: 500}, {Slab: 2, Pages: 300}}},
		{Name: "idx", PageBytes: 64, Regions: []Region{{Slab: 3, Pages: 1500}}},
	}}
	for seed := uint64(1); seed <= 3; seed++ {
		a, err := New(l)
		if err != nil {
			t.Fatal(err)
		}
		ref := newOracle(l)
		r := rand.New(rand.NewPCG(seed, 0xb10c))
		var live []ObjectID
		next := ObjectID(1)
		maxBlocks, merges, fragmented, peak := 0, 0, 0, 0
		for step := range 6000 {
			if step%1200 == 700 {
				peak = len(live)
			}
			// Fill the slab with small objects, then release half of them
			// at random, leaving hundreds of free ranges, then fill again
			// (first fit takes the holes from the lowest, and blocks merge).
			var o op
			switch n := r.IntN(1000); {
			case n < 5 && len(live) > 0:
				o = op{code: 'e', id: next, pages: 20 + r.Int64N(200), kinds: a.AllKinds(), victims: append([]ObjectID(nil), live...)}
				next++
			case n < 10:
				o = op{code: 'r', id: next, pages: 20 + r.Int64N(200), kinds: a.AllKinds()}
				next++
			case step%1200 < 700 || len(live) <= peak/2:
				o = op{code: 'r', id: next, pages: 1 + r.Int64N(3), kinds: Kinds(1 | r.IntN(2)<<1)}
				next++
			default:
				i := r.IntN(len(live))
				o = op{code: 'x', id: live[i]}
				live[i] = live[len(live)-1]
				live = live[:len(live)-1]
			}
			blocks := len(a.free[0].blocks)
			n, err := o.apply(a)
			nRef, errRef := o.applyOracle(ref, l)
			if !sameErr(err, errRef) || n != nRef {
				t.Fatalf("seed %d step %d %v: allocator (%d, %v), oracle (%d, %v)", seed, step, o, n, err, nRef, errRef)
			}
			if o.code == 'e' && err == nil {
				live = live[n:]
			}
			if (o.code == 'r' || o.code == 'e') && err == nil {
				if err := a.Commit(o.id); err != nil {
					t.Fatal(err)
				}
				if err := ref.commit(o.id); err != nil {
					t.Fatal(err)
				}
				live = append(live, o.id)
				if info, _ := a.Object(o.id); len(info.Ranges) > 2 {
					fragmented++
				}
			}
			if len(a.free[0].blocks) < blocks && a.free[0].count > blockMax {
				merges++
			}
			maxBlocks = max(maxBlocks, len(a.free[0].blocks))
			if err := a.free[0].checkBlocks(); err != nil {
				t.Fatalf("seed %d step %d %v: %v", seed, step, o, err)
			}
			if step%50 == 0 {
				if err := a.CheckInvariants(); err != nil {
					t.Fatalf("seed %d step %d %v: %v", seed, step, o, err)
				}
				if err := ref.matches(a); err != nil {
					t.Fatalf("seed %d step %d %v: %v", seed, step, o, err)
				}
			}
		}
		if maxBlocks < 3 || merges == 0 || fragmented == 0 {
			t.Errorf("seed %d: at most %d blocks, %d merges, %d fragmented reservations; want at least 3, 1, 1", seed, maxBlocks, merges, fragmented)
		}
		t.Logf("seed %d: at most %d blocks, %d merges, %d fragmented reservations, %d free ranges at the end", seed, maxBlocks, merges, fragmented, a.free[0].count)
	}
}

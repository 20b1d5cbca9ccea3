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
		maxBlocks, fragmented, peak := 0, 0, 0
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
		if maxBlocks < 3 || fragmented == 0 {
			t.Errorf("seed %d: at most %d blocks, %d fragmented reservations; want at least 3, 1", seed, maxBlocks, fragmented)
		}
		t.Logf("seed %d: at most %d blocks, %d fragmented reservations, %d free ranges at the end", seed, maxBlocks, fragmented, a.free[0].count)
	}
}

// TestFreeListBlocksMerge: two blocks that both still hold ranges merge
// when together they fit in half a block, and first fit, the order and the
// block maxima stay right. (The oracle test above cannot tell a merge from
// a block emptied by a delete; this one builds the case.)
func TestFreeListBlocksMerge(t *testing.T) {
	var f freeList
	for i := range blockMax + blockMax/2 {
		f.appendRange(int64(4*i), 1+int64(i%3)) // never adjacent
	}
	if len(f.blocks) != 2 {
		t.Fatalf("%d ranges in %d blocks, want 2", f.count, len(f.blocks))
	}
	for _, tc := range []struct {
		block, deletes, wantBlocks int
	}{
		// Block 0 down to a quarter: no merge (16 + 32 > 32).
		{0, blockMax * 3 / 4, 2},
		// Block 1 down to a quarter: the two fit in half a block.
		{1, blockMax / 4, 1},
	} {
		for range tc.deletes {
			f.deleteAt(tc.block, 0)
		}
		if len(f.blocks) != tc.wantBlocks {
			t.Fatalf("after %d deletes from block %d: %d blocks, want %d", tc.deletes, tc.block, len(f.blocks), tc.wantBlocks)
		}
		if err := f.checkBlocks(); err != nil {
			t.Fatal(err)
		}
	}
	if f.count != blockMax/2 || len(f.blocks[0].ranges) != blockMax/2 {
		t.Fatalf("%d ranges, %d in the block, want %d", f.count, len(f.blocks[0].ranges), blockMax/2)
	}
	last := int64(-1)
	f.walk(func(start, pages int64) bool {
		if start <= last {
			t.Fatalf("range at %d after one at %d", start, last)
		}
		last = start
		return true
	})
}

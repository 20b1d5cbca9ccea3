package placement

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/kvtier/kvtier/tiers"
)

// testLayouts are the layouts the property tests run on: one kind in one
// region, two kinds with several regions (region boundaries inside the page
// space), and a tiny one that is always nearly full.
func testLayouts() map[string]Layout {
	return map[string]Layout{
		"one-kind": {Kinds: []KindLayout{{Name: "kv", PageBytes: 4096, Regions: []Region{{Slab: 0, Offset: 0, Pages: 64}}}}},
		"two-kinds-multi-slab": {Kinds: []KindLayout{
			{Name: "kv", PageBytes: 4096, Regions: []Region{{Slab: 0, Offset: 0, Pages: 24}, {Slab: 1, Offset: 0, Pages: 16}, {Slab: 2, Offset: 0, Pages: 8}}},
			{Name: "idx", PageBytes: 512, Regions: []Region{{Slab: 2, Offset: 8 * 4096, Pages: 48}}},
		}},
		"tiny": {Kinds: []KindLayout{{Name: "kv", PageBytes: 1, Regions: []Region{{Pages: 3}, {Slab: 1, Pages: 2}}}}},
	}
}

// TestReplicasAgree runs identical seeded op sequences on 8 replicas and
// checks, after every op, that all digests are equal, that the state
// matches the reference oracle, and that the invariants hold.
func TestReplicasAgree(t *testing.T) {
	const replicas, seeds, steps = 8, 40, 300
	for name, l := range testLayouts() {
		t.Run(name, func(t *testing.T) {
			// ok counts successful ops per code, evicting counts evict-to-fit
			// calls that released victims: the stream must exercise them all.
			ok := map[byte]int{}
			evicting, fragmented := 0, 0
			for seed := uint64(1); seed <= seeds; seed++ {
				gen := newOpGen(seed, l)
				var reps [replicas]*Allocator
				for i := range reps {
					var err error
					if reps[i], err = New(l); err != nil {
						t.Fatal(err)
					}
				}
				ref := newOracle(l)
				for step := 0; step < steps; step++ {
					o := gen.next()
					n0, err0 := o.apply(reps[0])
					nRef, errRef := o.applyOracle(ref, l)
					if !sameErr(err0, errRef) || n0 != nRef {
						t.Fatalf("seed %d step %d %v: allocator (%d, %v), oracle (%d, %v)", seed, step, o, n0, err0, nRef, errRef)
					}
					for i := 1; i < replicas; i++ {
						n, err := o.apply(reps[i])
						if n != n0 || (err == nil) != (err0 == nil) {
							t.Fatalf("seed %d step %d %v: replica %d got (%d, %v), replica 0 (%d, %v)", seed, step, o, i, n, err, n0, err0)
						}
					}
					d := reps[0].Digest()
					for i := 1; i < replicas; i++ {
						if reps[i].Digest() != d {
							t.Fatalf("seed %d step %d %v: replica %d digest differs", seed, step, o, i)
						}
					}
					if err0 == nil {
						ok[o.code]++
					}
					if n0 > 0 {
						evicting++
					}
					if (o.code == 'r' || o.code == 'e') && err0 == nil {
						if info, _ := reps[0].Object(o.id); len(info.Ranges) > popcount(o.kinds) {
							fragmented++
						}
					}
					if err := reps[0].CheckInvariants(); err != nil {
						t.Fatalf("seed %d step %d %v: %v", seed, step, o, err)
					}
					if err := ref.matches(reps[0]); err != nil {
						t.Fatalf("seed %d step %d %v: %v", seed, step, o, err)
					}
				}
			}
			for _, code := range []byte("rxcsez") {
				if ok[code] == 0 {
					t.Errorf("no successful %q op in %d seeds", code, seeds)
				}
			}
			if evicting == 0 || fragmented == 0 {
				t.Errorf("%d evict-to-fit calls evicted, %d reservations fragmented; want both > 0", evicting, fragmented)
			}
			t.Logf("ok ops %v, evicting %d, fragmented reservations %d", ok, evicting, fragmented)
		})
	}
}

func popcount(k Kinds) int {
	n := 0
	for ; k != 0; k &= k - 1 {
		n++
	}
	return n
}

// TestDivergentOpChangesDigest applies one extra or different op on one
// replica and checks the digest notices.
func TestDivergentOpChangesDigest(t *testing.T) {
	l := testLayouts()["two-kinds-multi-slab"]
	for seed := uint64(1); seed <= 30; seed++ {
		gen := newOpGen(seed, l)
		a, _ := New(l)
		b, _ := New(l)
		for step := 0; step < 50; step++ {
			o := gen.next()
			o.apply(a)
			o.apply(b)
		}
		if a.Digest() != b.Digest() {
			t.Fatalf("seed %d: replicas differ before the divergent op", seed)
		}
		// Divergent ops that succeed must change the digest.
		var id ObjectID = 1 << 40
		diverge := []op{
			{code: 'r', id: id, pages: 1, kinds: KindSet(1)},
			{code: 'r', id: id, pages: 1, kinds: KindSet(0)},
		}
		if ids := gen.liveIDs(false); len(ids) > 0 {
			oid := ids[0]
			obj := a.objects[oid]
			if !obj.committed {
				diverge = append(diverge, op{code: 'c', id: oid})
			} else if obj.pages > 1 {
				diverge = append(diverge, op{code: 's', id: oid, at: 1, prefix: id + 1})
			}
			diverge = append(diverge, op{code: 'x', id: oid})
		}
		for _, o := range diverge {
			c, _ := New(l)
			gen2 := newOpGen(seed, l)
			for step := 0; step < 50; step++ {
				gen2.next().apply(c)
			}
			before := c.Digest()
			if _, err := o.apply(c); err != nil {
				if errors.Is(err, ErrNoSpace) {
					continue
				}
				t.Fatalf("seed %d: divergent %v: %v", seed, o, err)
			}
			if c.Digest() == before || c.Digest() == a.Digest() {
				t.Fatalf("seed %d: divergent %v did not change the digest", seed, o)
			}
		}
	}
}

// TestReserveReleaseRestoresDigest checks that a reservation followed by
// its release returns to the same canonical state, whatever the
// fragmentation (coalescing must undo the split of free ranges).
func TestReserveReleaseRestoresDigest(t *testing.T) {
	for name, l := range testLayouts() {
		t.Run(name, func(t *testing.T) {
			for seed := uint64(1); seed <= 50; seed++ {
				gen := newOpGen(seed, l)
				a, _ := New(l)
				for step := 0; step < 40; step++ {
					gen.next().apply(a)
				}
				before := a.Digest()
				st := a.Stats()
				for pages := int64(1); pages <= st.FreePages[0]; pages++ {
					if err := a.Reserve(1<<50, pages, KindSet(0)); err != nil {
						t.Fatalf("seed %d: reserve %d of %d free: %v", seed, pages, st.FreePages[0], err)
					}
					if a.Digest() == before {
						t.Fatalf("seed %d: reserve %d pages left the digest unchanged", seed, pages)
					}
					if err := a.Release(1 << 50); err != nil {
						t.Fatal(err)
					}
					if a.Digest() != before {
						t.Fatalf("seed %d: reserve+release of %d pages changed the digest", seed, pages)
					}
				}
			}
		})
	}
}

// TestCapacityChargedOnce checks that an object costs its pages once on
// every replica, however many ranks share it.
func TestCapacityChargedOnce(t *testing.T) {
	l := testLayouts()["two-kinds-multi-slab"]
	for rank := 0; rank < 8; rank++ {
		a, _ := New(l)
		if err := a.Reserve(1, 10, a.AllKinds()); err != nil {
			t.Fatal(err)
		}
		for k := range l.Kinds {
			if got, want := a.FreePages(tiers.PayloadKind(k)), l.Kinds[k].Pages()-10; got != want {
				t.Fatalf("replica %d kind %d: %d free pages, want %d", rank, k, got, want)
			}
		}
	}
}

// TestEightReplicasEvictToFit mirrors the seed's eight-rank test: fill the
// slab with committed objects, then keep reserving with evict-to-fit,
// victims in insertion order (oldest first, as an LRU policy would give),
// on 8 replicas. Every replica must evict the same victims and end in the
// same state, and large reservations must be served from coalesced space.
func TestEightReplicasEvictToFit(t *testing.T) {
	l := testLayouts()["two-kinds-multi-slab"]
	const seed = 11
	r := rand.New(rand.NewPCG(seed, 0))
	var reps [8]*Allocator
	for i := range reps {
		reps[i], _ = New(l)
	}
	var order []ObjectID // live committed objects, oldest first
	next := ObjectID(1)
	contiguousBig := 0
	for step := 0; step < 400; step++ {
		pages := 1 + r.Int64N(12)
		id := next
		next++
		var evicted int
		for i, a := range reps {
			n, err := a.EvictToFit(id, pages, a.AllKinds(), order)
			if err != nil {
				t.Fatalf("seed %d step %d replica %d: %v", seed, step, i, err)
			}
			if i == 0 {
				evicted = n
			} else if n != evicted {
				t.Fatalf("seed %d step %d: replica %d evicted %d, replica 0 %d", seed, step, i, n, evicted)
			}
			if err := a.Commit(id); err != nil {
				t.Fatal(err)
			}
		}
		order = append(order[evicted:], id)
		d := reps[0].Digest()
		for i := 1; i < len(reps); i++ {
			if reps[i].Digest() != d {
				t.Fatalf("seed %d step %d: replica %d digest differs", seed, step, i)
			}
		}
		if info, _ := reps[0].Object(id); pages >= 8 && evicted > 1 && len(info.Ranges) == 2 {
			contiguousBig++ // one range per kind, made of several victims' pages
		}
		if err := reps[0].CheckInvariants(); err != nil {
			t.Fatalf("seed %d step %d: %v", seed, step, err)
		}
	}
	if contiguousBig == 0 {
		t.Fatalf("seed %d: no large reservation was served contiguously from several victims' coalesced pages", seed)
	}
}

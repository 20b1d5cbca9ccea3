package idtable

import (
	"math/rand/v2"
	"slices"
	"testing"
)

type item struct{ id uint64 }

// TestTableMatchesMap drives the table and a plain map with the same adds
// (increasing ids, some skipped), puts (in place, or out of order) and
// deletes — mostly recent ids,
// some long-lived survivors — and asserts equal answers, ordered ids and
// bounded memory.
func TestTableMatchesMap(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 5))
		tab := New[uint64, *item](1)
		ref := map[uint64]*item{}
		var live []uint64
		next := uint64(1)
		for step := range 5000 {
			switch op := rng.IntN(10); {
			case op < 5 || len(live) == 0:
				next += uint64(rng.IntN(3)) // ids may skip
				it := &item{id: next}
				if !tab.Add(next, it) {
					t.Fatalf("seed %d step %d: add of id %d refused", seed, step, next)
				}
				ref[next] = it
				live = append(live, next)
				next++
			case op == 5:
				// Put: a live id replaced, or an id skipped earlier added
				// out of order.
				id := live[rng.IntN(len(live))]
				if rng.IntN(2) == 0 && next > 2 {
					id = uint64(rng.IntN(int(next-1))) + 1
					if ref[id] == nil {
						live = append(live, id)
					}
				}
				it := &item{id: id}
				tab.Put(id, it)
				ref[id] = it
			default:
				// Delete a recent id mostly, an old one sometimes.
				i := len(live) - 1 - rng.IntN(min(len(live), 8))
				if rng.IntN(10) == 0 {
					i = rng.IntN(len(live))
				}
				id := live[i]
				live = append(live[:i], live[i+1:]...)
				tab.Del(id)
				delete(ref, id)
			}
			if tab.Len() != len(ref) {
				t.Fatalf("seed %d step %d: table holds %d, map %d", seed, step, tab.Len(), len(ref))
			}
			probe := uint64(rng.IntN(int(next) + 2))
			if tab.Get(probe) != ref[probe] {
				t.Fatalf("seed %d step %d: Get(%d) = %v, map has %v", seed, step, probe, tab.Get(probe), ref[probe])
			}
			if slots, held := tab.recentSpan(); slots > 4*held+130 {
				t.Fatalf("seed %d step %d: recent spans %d slots for %d entries", seed, step, slots, held)
			}
		}
		ids := tab.AppendIDs(nil)
		want := slices.Sorted(func(yield func(uint64) bool) {
			for id := range ref {
				if !yield(id) {
					return
				}
			}
		})
		if !slices.Equal(ids, want) {
			t.Fatalf("seed %d: AppendIDs %v, want %v", seed, ids, want)
		}
	}
}

// TestTableRefuses: an Add of an id not above every earlier one, or of
// the zero value, changes nothing.
func TestTableRefuses(t *testing.T) {
	tab := New[uint64, *item](1)
	a := &item{1}
	for _, tc := range []struct {
		name string
		do   func() bool
		want bool
	}{
		{"add 5", func() bool { return tab.Add(5, a) }, true},
		{"add 5 again", func() bool { return tab.Add(5, a) }, false},
		{"add 3 below", func() bool { return tab.Add(3, a) }, false},
		{"add nil", func() bool { return tab.Add(9, nil) }, false},
		{"put 5", func() bool { tab.Put(5, &item{5}); return true }, true},
	} {
		if got := tc.do(); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if tab.Len() != 1 || tab.Get(5) == nil || tab.Get(5) == a {
		t.Errorf("after the refusals: len %d, Get(5) %v", tab.Len(), tab.Get(5))
	}
	tab.Clear(10)
	if tab.Len() != 0 || tab.Get(5) != nil || !tab.Add(10, a) {
		t.Errorf("after Clear(10): len %d, Get(5) %v", tab.Len(), tab.Get(5))
	}
}

package leafheap

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvtier/kvtier/policy"
)

// TestHeapAgainstSort checks, over seeded random operations, that Min is
// always the least (key, id) among the present slots.
func TestHeapAgainstSort(t *testing.T) {
	for seed := uint64(1); seed <= 50; seed++ {
		rng := rand.New(rand.NewPCG(seed, 1))
		var h Heap
		model := map[int32]Key{}
		for step := 0; step < 2000; step++ {
			s := int32(rng.IntN(64))
			switch rng.IntN(3) {
			case 0, 1:
				k := Key{A: uint64(rng.IntN(8)), B: uint64(rng.IntN(8))}
				h.Set(s, policy.NodeID(s), k)
				model[s] = k
			case 2:
				h.Remove(s)
				delete(model, s)
			}
			if msg := h.Check(); msg != "" {
				t.Fatalf("seed %d step %d: %s", seed, step, msg)
			}
			if h.Len() != len(model) {
				t.Fatalf("seed %d step %d: len %d, model %d", seed, step, h.Len(), len(model))
			}
			var best int32 = -1
			for s, k := range model {
				if best < 0 || k.Less(policy.NodeID(s), model[best], policy.NodeID(best)) {
					best = s
				}
			}
			slot, _, _, ok := h.Min()
			if ok != (best >= 0) || (ok && slot != best) {
				t.Fatalf("seed %d step %d: Min slot %d ok %v, want %d", seed, step, slot, ok, best)
			}
		}
	}
}

func TestTableReusesSlots(t *testing.T) {
	tab := NewTable[uint64]()
	var slots []int32
	for id := policy.NodeID(1); id <= 10; id++ {
		s, fresh := tab.Add(id)
		if !fresh {
			t.Fatalf("id %d not fresh", id)
		}
		*tab.At(s) = uint64(id)
		slots = append(slots, s)
	}
	if s, fresh := tab.Add(3); fresh || s != slots[2] {
		t.Fatalf("re-adding id 3: slot %d fresh %v", s, fresh)
	}
	s, ok := tab.Delete(4)
	if !ok || *tab.At(s) != 0 {
		t.Fatalf("delete 4: ok %v value %d", ok, *tab.At(s))
	}
	if _, ok := tab.Lookup(4); ok {
		t.Fatal("id 4 still present")
	}
	s2, _ := tab.Add(99)
	if s2 != s || tab.ID(s2) != 99 || tab.Len() != 10 {
		t.Fatalf("slot of 99 = %d (freed %d), len %d", s2, s, tab.Len())
	}
	if !slices.Contains(slots, s2) {
		t.Fatal("table grew instead of reusing a slot")
	}
}

package leafheap

import (
	"math/rand/v2"
	"testing"

	"github.com/kvtier/kvtier/policy"
)

// TestIDIndexMatchesMap checks idIndex against a plain map over seeded
// streams of puts and deletes: increasing ids (as the tree hands them
// out), with old survivors, gaps, far jumps and ids below base.
func TestIDIndexMatchesMap(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed))
		x := idIndex{old: make(map[policy.NodeID]int32)}
		ref := map[policy.NodeID]int32{}
		var live []policy.NodeID
		next := policy.NodeID(1 + rng.IntN(1000))
		for step := 0; step < 3000; step++ {
			switch r := rng.IntN(10); {
			case r < 5 || len(live) == 0:
				id := next
				switch rng.IntN(20) {
				case 0:
					id += policy.NodeID(rng.IntN(100000)) // a far jump
				case 1:
					id = policy.NodeID(rng.IntN(int(next))) // maybe below base
				}
				if _, ok := ref[id]; ok || id == 0 {
					continue
				}
				next = max(next, id) + 1
				s := int32(rng.IntN(1 << 20))
				x.put(id, s)
				ref[id] = s
				live = append(live, id)
			default:
				// Mostly delete recent ids, keep some old survivors.
				i := len(live) - 1 - rng.IntN(min(len(live), 32))
				if rng.IntN(8) == 0 {
					i = rng.IntN(len(live))
				}
				id := live[i]
				live[i] = live[len(live)-1]
				live = live[:len(live)-1]
				x.del(id)
				delete(ref, id)
			}
			if x.len() != len(ref) {
				t.Fatalf("seed %d step %d: len %d, want %d", seed, step, x.len(), len(ref))
			}
		}
		for id, s := range ref {
			if got, ok := x.get(id); !ok || got != s {
				t.Fatalf("seed %d: get(%d) = %d, %v; want %d", seed, id, got, ok, s)
			}
		}
		for range 2000 {
			probe := policy.NodeID(rng.IntN(int(next) + 10))
			_, want := ref[probe]
			if _, ok := x.get(probe); ok != want {
				t.Fatalf("seed %d: get(%d) present=%v, want %v", seed, probe, ok, want)
			}
		}
		if len(x.recent) > 4*x.inRecent+1024+64 {
			t.Fatalf("seed %d: recent spans %d for %d ids", seed, len(x.recent), x.inRecent)
		}
	}
}

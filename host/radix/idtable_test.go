package radix

import (
	"math/rand/v2"
	"testing"

	"github.com/kvtier/kvtier/policy"
)

// TestIDTableMatchesMap drives the id table and a plain map with the same
// adds (increasing ids) and deletes — mostly recent ids, some long-lived
// survivors — and asserts equal answers and bounded memory.
func TestIDTableMatchesMap(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 5))
		tab := newIDTable(1)
		ref := map[policy.NodeID]*Node{}
		var live []policy.NodeID
		next := policy.NodeID(1)
		for step := range 5000 {
			if rng.IntN(2) == 0 || len(live) == 0 {
				n := &Node{id: next}
				next++
				tab.add(n)
				ref[n.id] = n
				live = append(live, n.id)
			} else {
				// Delete a recent id mostly, an old one sometimes.
				i := len(live) - 1 - rng.IntN(min(len(live), 8))
				if rng.IntN(10) == 0 {
					i = rng.IntN(len(live))
				}
				id := live[i]
				live = append(live[:i], live[i+1:]...)
				tab.del(id)
				delete(ref, id)
			}
			if tab.len() != len(ref) {
				t.Fatalf("seed %d step %d: table holds %d, map %d", seed, step, tab.len(), len(ref))
			}
			probe := policy.NodeID(rng.IntN(int(next) + 2))
			if tab.get(probe) != ref[probe] {
				t.Fatalf("seed %d step %d: get(%d) = %v, map has %v", seed, step, probe, tab.get(probe), ref[probe])
			}
			if len(tab.recent) > 4*tab.inRecent+130 {
				t.Fatalf("seed %d step %d: recent spans %d slots for %d nodes", seed, step, len(tab.recent), tab.inRecent)
			}
		}
		for id, n := range ref {
			if tab.get(id) != n {
				t.Fatalf("seed %d: live id %d lost", seed, id)
			}
		}
	}
}

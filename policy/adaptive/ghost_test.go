package adaptive

import (
	"math/rand/v2"
	"testing"
)

// refGhost is the oracle: a slice of (key, tag) in eviction order and a
// set of counted keys.
type refGhost struct {
	keys    []uint64
	tags    []uint8
	counted map[uint64]bool
}

func (r *refGhost) add(k uint64, tag uint8, limit int) {
	if limit <= 0 {
		return
	}
	for len(r.keys) >= limit {
		old := r.keys[0]
		r.keys, r.tags = r.keys[1:], r.tags[1:]
		if !r.has(old) {
			delete(r.counted, old)
		}
	}
	r.keys, r.tags = append(r.keys, k), append(r.tags, tag)
	delete(r.counted, k)
}

func (r *refGhost) has(k uint64) bool {
	for _, x := range r.keys {
		if x == k {
			return true
		}
	}
	return false
}

func (r *refGhost) take(k uint64) (uint8, bool) {
	for i := len(r.keys) - 1; i >= 0; i-- {
		if r.keys[i] == k {
			if r.counted[k] {
				return 0, false
			}
			r.counted[k] = true
			return r.tags[i], true
		}
	}
	return 0, false
}

// TestGhostMatchesReference drives the ghost and a slice reference with
// seeded adds (repeated keys, growing and shrinking limits) and takes.
func TestGhostMatchesReference(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		var g ghost
		ref := refGhost{counted: map[uint64]bool{}}
		limit := 1 + rng.IntN(40)
		for step := 0; step < 1500; step++ {
			k := 1 + uint64(rng.IntN(60))
			switch rng.IntN(10) {
			case 0:
				limit = rng.IntN(200)
			case 1, 2, 3, 4:
				tag := uint8(rng.IntN(2))
				g.add(k, tag, limit)
				ref.add(k, tag, limit)
			default:
				gt, gok := g.take(k)
				rt, rok := ref.take(k)
				if gok != rok || gt != rt {
					t.Fatalf("seed %d step %d: take(%d) = %d, %v; want %d, %v", seed, step, k, gt, gok, rt, rok)
				}
			}
			if msg := g.check(); msg != "" {
				t.Fatalf("seed %d step %d: %s", seed, step, msg)
			}
			if g.count != len(ref.keys) {
				t.Fatalf("seed %d step %d: %d entries, want %d", seed, step, g.count, len(ref.keys))
			}
		}
	}
}

package hindsight

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// refGhost is the obviously correct ghost: a slice in eviction order.
type refGhost struct{ keys []uint64 }

func (r *refGhost) add(k uint64, limit int) {
	if limit <= 0 {
		return
	}
	r.keys = append(r.keys, k)
	if len(r.keys) > limit {
		r.keys = r.keys[len(r.keys)-limit:]
	}
}

func (r *refGhost) has(k uint64) bool {
	for _, x := range r.keys {
		if x == k {
			return true
		}
	}
	return false
}

// runGhost drives a ghost and the reference with ops decoded from data
// (3 bytes per op: kind, key, limit) and reports the first disagreement.
func runGhost(t *testing.T, data []byte) {
	t.Helper()
	var g ghost
	var r refGhost
	limit := 1
	for i := 0; i+3 <= len(data); i += 3 {
		// Small key space so keys repeat and collide; never 0.
		k := uint64(data[i+1]%61) + 1
		switch data[i] % 4 {
		case 0, 1:
			g.add(k, limit)
			r.add(k, limit)
		case 2:
			if g.has(k) != r.has(k) {
				t.Fatalf("op %d: has(%d) = %t, reference %t (limit %d)", i/3, k, g.has(k), r.has(k), limit)
			}
		case 3:
			// Limits only grow, as the peak page count does.
			limit = max(limit, int(data[i+2]%48))
		}
		if msg := g.check(); msg != "" {
			t.Fatalf("op %d: %s", i/3, msg)
		}
	}
	for k := uint64(1); k <= 61; k++ {
		if g.has(k) != r.has(k) {
			t.Fatalf("end: has(%d) = %t, reference %t", k, g.has(k), r.has(k))
		}
	}
}

func TestGhostAgainstReference(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0x9057))
		data := make([]byte, 3*2000)
		for i := range data {
			data[i] = byte(rng.UintN(256))
		}
		t.Run("", func(t *testing.T) {
			defer func() {
				if t.Failed() {
					t.Logf("seed %d", seed)
				}
			}()
			runGhost(t, data)
		})
	}
}

func TestGhostZeroLimit(t *testing.T) {
	var g ghost
	g.add(5, 0)
	if g.has(5) {
		t.Fatal("a ghost with limit 0 remembers a key")
	}
	if msg := g.check(); msg != "" {
		t.Fatal(msg)
	}
}

func TestGhostLargeKeys(t *testing.T) {
	// Real page keys are uniform 64-bit values: exercise wrap-around of
	// the probe runs with a table kept small.
	var g ghost
	var r refGhost
	rng := rand.New(rand.NewPCG(7, 7))
	keys := make([]uint64, 40)
	for i := range keys {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], rng.Uint64()|1)
		keys[i] = binary.LittleEndian.Uint64(b[:])
	}
	for i := range 5000 {
		k := keys[rng.IntN(len(keys))]
		g.add(k, 24)
		r.add(k, 24)
		if msg := g.check(); msg != "" {
			t.Fatalf("op %d: %s", i, msg)
		}
	}
	for _, k := range keys {
		if g.has(k) != r.has(k) {
			t.Fatalf("has(%#x) = %t, reference %t", k, g.has(k), r.has(k))
		}
	}
}

// FuzzGhost checks the ghost against the reference on arbitrary op
// streams.
func FuzzGhost(f *testing.F) {
	f.Add([]byte{3, 0, 10, 0, 1, 0, 0, 2, 0, 2, 1, 0})
	f.Add([]byte{3, 0, 2, 0, 1, 0, 0, 62, 0, 0, 123, 0, 2, 1, 0, 2, 62, 0})
	f.Add([]byte{0, 5, 0, 0, 5, 0, 2, 5, 0, 3, 0, 47, 0, 5, 0, 2, 5, 0})
	f.Fuzz(func(t *testing.T, data []byte) { runGhost(t, data) })
}

package ghost

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// refTable is the obviously correct ghost: a slice of (key, tag) in
// eviction order and the set of taken keys.
type refTable struct {
	keys  []uint64
	tags  []uint8
	taken map[uint64]bool
}

func newRef() *refTable { return &refTable{taken: map[uint64]bool{}} }

func (r *refTable) add(k uint64, tag uint8, limit int) {
	if limit <= 0 {
		return
	}
	for len(r.keys) >= limit {
		old := r.keys[0]
		r.keys, r.tags = r.keys[1:], r.tags[1:]
		if !r.has(old) {
			delete(r.taken, old)
		}
	}
	r.keys, r.tags = append(r.keys, k), append(r.tags, tag)
	delete(r.taken, k)
}

func (r *refTable) has(k uint64) bool {
	for _, x := range r.keys {
		if x == k {
			return true
		}
	}
	return false
}

func (r *refTable) take(k uint64) (uint8, bool) {
	for i := len(r.keys) - 1; i >= 0; i-- {
		if r.keys[i] == k {
			if r.taken[k] {
				return 0, false
			}
			r.taken[k] = true
			return r.tags[i], true
		}
	}
	return 0, false
}

// TestTakeMatchesReference drives a Table and the reference with seeded
// tagged adds (repeated keys, growing and shrinking limits) and takes.
func TestTakeMatchesReference(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		var g Table
		ref := newRef()
		limit := 1 + rng.IntN(40)
		for step := 0; step < 1500; step++ {
			k := 1 + uint64(rng.IntN(60))
			switch rng.IntN(10) {
			case 0:
				limit = rng.IntN(200)
			case 1, 2, 3, 4:
				tag := uint8(rng.IntN(2))
				g.Add(k, tag, limit)
				ref.add(k, tag, limit)
			default:
				gt, gok := g.Take(k)
				rt, rok := ref.take(k)
				if gok != rok || gt != rt {
					t.Fatalf("seed %d step %d: Take(%d) = %d, %v; want %d, %v", seed, step, k, gt, gok, rt, rok)
				}
			}
			if msg := g.Check(); msg != "" {
				t.Fatalf("seed %d step %d: %s", seed, step, msg)
			}
			if g.Len() != len(ref.keys) {
				t.Fatalf("seed %d step %d: %d entries, want %d", seed, step, g.Len(), len(ref.keys))
			}
		}
	}
}

// runHas drives a Table and the reference with ops decoded from data (3
// bytes per op: kind, key, limit) and reports the first disagreement of
// Has.
func runHas(t *testing.T, data []byte) {
	t.Helper()
	var g Table
	r := newRef()
	limit := 1
	for i := 0; i+3 <= len(data); i += 3 {
		// Small key space so keys repeat and collide; never 0.
		k := uint64(data[i+1]%61) + 1
		switch data[i] % 4 {
		case 0, 1:
			g.Add(k, 0, limit)
			r.add(k, 0, limit)
		case 2:
			if g.Has(k) != r.has(k) {
				t.Fatalf("op %d: Has(%d) = %t, reference %t (limit %d)", i/3, k, g.Has(k), r.has(k), limit)
			}
		case 3:
			// Limits only grow, as the peak page count does.
			limit = max(limit, int(data[i+2]%48))
		}
		if msg := g.Check(); msg != "" {
			t.Fatalf("op %d: %s", i/3, msg)
		}
	}
	for k := uint64(1); k <= 61; k++ {
		if g.Has(k) != r.has(k) {
			t.Fatalf("end: Has(%d) = %t, reference %t", k, g.Has(k), r.has(k))
		}
	}
}

func TestHasAgainstReference(t *testing.T) {
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
			runHas(t, data)
		})
	}
}

func TestZeroLimit(t *testing.T) {
	var g Table
	g.Add(5, 0, 0)
	if _, taken := g.Take(5); g.Has(5) || taken || g.Len() != 0 {
		t.Fatalf("a ghost with limit 0 remembers a key: Has %t, Take %t, Len %d", g.Has(5), taken, g.Len())
	}
	if msg := g.Check(); msg != "" {
		t.Fatal(msg)
	}
}

func TestLargeKeys(t *testing.T) {
	// Real page keys are uniform 64-bit values: exercise wrap-around of
	// the probe runs with a table kept small.
	var g Table
	r := newRef()
	rng := rand.New(rand.NewPCG(7, 7))
	keys := make([]uint64, 40)
	for i := range keys {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], rng.Uint64()|1)
		keys[i] = binary.LittleEndian.Uint64(b[:])
	}
	for i := range 5000 {
		k := keys[rng.IntN(len(keys))]
		g.Add(k, 0, 24)
		r.add(k, 0, 24)
		if msg := g.Check(); msg != "" {
			t.Fatalf("op %d: %s", i, msg)
		}
	}
	for _, k := range keys {
		if g.Has(k) != r.has(k) {
			t.Fatalf("Has(%#x) = %t, reference %t", k, g.Has(k), r.has(k))
		}
	}
}

// FuzzHas checks Has against the reference on arbitrary op streams.
func FuzzHas(f *testing.F) {
	f.Add([]byte{3, 0, 10, 0, 1, 0, 0, 2, 0, 2, 1, 0})
	f.Add([]byte{3, 0, 2, 0, 1, 0, 0, 62, 0, 0, 123, 0, 2, 1, 0, 2, 62, 0})
	f.Add([]byte{0, 5, 0, 0, 5, 0, 2, 5, 0, 3, 0, 47, 0, 5, 0, 2, 5, 0})
	f.Fuzz(func(t *testing.T, data []byte) { runHas(t, data) })
}

package l3disk

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/kvtier/kvtier/pagehash"
)

// TestSlotPoolRandom drives a pool with a seeded random op stream against
// a simple reference (a map and an ordered slice) and checks the pool's
// invariants and LRU order after every step.
func TestSlotPoolRandom(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		rng := rand.New(rand.NewPCG(seed, 1))
		n := 1 + rng.IntN(40)
		p := newSlotPool(n)
		var (
			inflight []int32
			lru      []int32 // reference order, coldest first
			clock    uint64
			next     uint64
		)
		hashOf := func() pagehash.Hash {
			next++
			var h pagehash.Hash
			binary.LittleEndian.PutUint64(h[:], next)
			return h
		}
		removeLRU := func(s int32) {
			for i, x := range lru {
				if x == s {
					lru = append(lru[:i], lru[i+1:]...)
					return
				}
			}
			t.Fatalf("seed %d: slot %d not in reference lru", seed, s)
		}
		for step := range 400 {
			switch op := rng.IntN(6); {
			case op == 0 || op == 1:
				s, ok := p.alloc(hashOf())
				if !ok && len(inflight)+len(lru) != n {
					t.Fatalf("seed %d step %d: alloc ok=%v with %d used of %d", seed, step, ok, len(inflight)+len(lru), n)
				}
				if ok {
					inflight = append(inflight, s)
				}
			case op == 2 && len(inflight) > 0:
				i := rng.IntN(len(inflight))
				s := inflight[i]
				inflight = append(inflight[:i], inflight[i+1:]...)
				if rng.IntN(4) == 0 {
					p.abort(s)
				} else {
					clock++
					p.commit(s, clock)
					lru = append(lru, s)
				}
			case op == 3 && len(lru) > 0:
				s := lru[rng.IntN(len(lru))]
				clock++
				p.touch(s, clock)
				removeLRU(s)
				lru = append(lru, s)
			case op == 4 && len(lru) > 0:
				if h, ok := p.coldestForTest(); !ok || h != lru[0] {
					t.Fatalf("seed %d step %d: coldest %d, reference %d", seed, step, h, lru[0])
				}
				s := lru[0]
				p.release(s)
				lru = lru[1:]
			case op == 5 && len(lru) > 0:
				s := lru[rng.IntN(len(lru))]
				p.release(s)
				removeLRU(s)
			}
			if err := p.check(); err != nil {
				t.Fatalf("seed %d step %d: %v", seed, step, err)
			}
			if p.live != len(lru) || p.used() != len(lru)+len(inflight) {
				t.Fatalf("seed %d step %d: live %d used %d, reference %d+%d", seed, step, p.live, p.used(), len(lru), len(inflight))
			}
		}
	}
}

func (p *slotPool) coldestForTest() (int32, bool) { return p.head, p.head != noSlot }

// TestSlotPoolFailLoud: broken invariants panic with the slot and state.
func TestSlotPoolFailLoud(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(p *slotPool)
	}{
		{"release free slot", func(p *slotPool) { p.release(0) }},
		{"commit free slot", func(p *slotPool) { p.commit(0, 1) }},
		{"abort live slot", func(p *slotPool) {
			s, _ := p.alloc(pagehash.Hash{1})
			p.commit(s, 1)
			p.abort(s)
		}},
		{"alloc held hash", func(p *slotPool) {
			p.alloc(pagehash.Hash{1})
			p.alloc(pagehash.Hash{1})
		}},
		{"occupy live slot", func(p *slotPool) {
			p.occupy(1, pagehash.Hash{1}, 1)
			p.occupy(1, pagehash.Hash{2}, 2)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			tc.do(newSlotPool(4))
		})
	}
}

func TestSlotPoolRebuild(t *testing.T) {
	p := newSlotPool(6)
	p.occupy(4, pagehash.Hash{4}, 1)
	p.occupy(1, pagehash.Hash{1}, 5)
	p.compactFree()
	if err := p.check(); err != nil {
		t.Fatal(err)
	}
	if p.freeCount() != 4 || p.live != 2 || p.head != 4 || p.tail != 1 {
		t.Fatalf("rebuilt pool: free %d live %d head %d tail %d", p.freeCount(), p.live, p.head, p.tail)
	}
	s, _ := p.alloc(pagehash.Hash{9})
	if s != 0 {
		t.Fatalf("first allocation after rebuild got slot %d, want lowest free 0", s)
	}
}

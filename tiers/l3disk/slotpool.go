package l3disk

import (
	"fmt"

	"github.com/kvtier/kvtier/pagehash"
)

// slotState is where a slot is in its life.
type slotState uint8

const (
	slotFree     slotState = iota // on the free list
	slotInFlight                  // allocated, being written and indexed
	slotLive                      // written, indexed, on the LRU list
)

func (s slotState) String() string {
	switch s {
	case slotFree:
		return "free"
	case slotInFlight:
		return "in-flight"
	case slotLive:
		return "live"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

const noSlot = int32(-1)

// slotPool is the bookkeeping of one slab file's slots: an O(1) free list
// (a stack: eviction frees arbitrary slots, so not a ring), the page-level
// LRU of live slots (an intrusive doubly linked list, coldest at head), and
// the hash each live slot holds.
//
// It is a pure value owned by the store's writer goroutine (or by the
// single-threaded cold start before the writer exists); it does no I/O and
// takes no locks. A broken invariant (double free, freeing a live slot,
// committing a free one) panics: it is a bug in the store, not bad input.
type slotPool struct {
	state  []slotState
	hash   []pagehash.Hash
	access []uint64
	prev   []int32
	next   []int32
	free   []int32
	head   int32 // coldest live slot
	tail   int32 // warmest live slot
	live   int
	// byHash is the inverse of the live and in-flight slots' hashes.
	byHash map[pagehash.Hash]int32
}

func newSlotPool(n int) *slotPool {
	p := &slotPool{
		state:  make([]slotState, n),
		hash:   make([]pagehash.Hash, n),
		access: make([]uint64, n),
		prev:   make([]int32, n),
		next:   make([]int32, n),
		free:   make([]int32, 0, n),
		byHash: make(map[pagehash.Hash]int32),
	}
	p.reset()
	return p
}

// reset frees every slot. Lower slots are handed out first.
func (p *slotPool) reset() {
	n := len(p.state)
	p.free = p.free[:0]
	for i := n - 1; i >= 0; i-- {
		p.free = append(p.free, int32(i))
		p.state[i] = slotFree
		p.prev[i], p.next[i] = noSlot, noSlot
	}
	p.head, p.tail, p.live = noSlot, noSlot, 0
	clear(p.byHash)
}

func (p *slotPool) size() int      { return len(p.state) }
func (p *slotPool) freeCount() int { return len(p.free) }

// used counts live and in-flight slots.
func (p *slotPool) used() int { return len(p.state) - len(p.free) }

// lookup returns the slot holding or receiving h.
func (p *slotPool) lookup(h pagehash.Hash) (int32, bool) {
	s, ok := p.byHash[h]
	return s, ok
}

// alloc takes a free slot for h (in flight). ok is false when none is free.
func (p *slotPool) alloc(h pagehash.Hash) (int32, bool) {
	if len(p.free) == 0 {
		return noSlot, false
	}
	if s, dup := p.byHash[h]; dup {
		panic(fmt.Sprintf("l3disk: alloc for hash %s already held by slot %d (%s)", h.Short(), s, p.state[s]))
	}
	s := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	if p.state[s] != slotFree {
		panic(fmt.Sprintf("l3disk: free list holds slot %d in state %s", s, p.state[s]))
	}
	p.state[s] = slotInFlight
	p.hash[s] = h
	p.byHash[h] = s
	return s, true
}

// abort returns an in-flight slot to the free list (its write failed).
func (p *slotPool) abort(s int32) {
	if p.state[s] != slotInFlight {
		panic(fmt.Sprintf("l3disk: abort of slot %d in state %s, want in-flight", s, p.state[s]))
	}
	delete(p.byHash, p.hash[s])
	p.state[s] = slotFree
	p.free = append(p.free, s)
}

// commit makes an in-flight slot live and warmest, accessed at.
func (p *slotPool) commit(s int32, at uint64) {
	if p.state[s] != slotInFlight {
		panic(fmt.Sprintf("l3disk: commit of slot %d in state %s, want in-flight", s, p.state[s]))
	}
	p.state[s] = slotLive
	p.live++
	p.access[s] = at
	p.pushTail(s)
}

// occupy marks a free slot live with hash h at access time at, for the
// cold-start rebuild. Slots must be occupied in increasing access order
// to build the LRU.
func (p *slotPool) occupy(s int32, h pagehash.Hash, at uint64) {
	if p.state[s] != slotFree {
		panic(fmt.Sprintf("l3disk: occupy of slot %d in state %s, want free", s, p.state[s]))
	}
	// NB: s stays on the free list until compactFree rebuilds the list in
	// one pass after every occupy of the rebuild.
	p.state[s] = slotLive
	p.hash[s] = h
	p.byHash[h] = s
	p.access[s] = at
	p.live++
	p.pushTail(s)
}

// compactFree rebuilds the free list from slot states after occupy calls.
func (p *slotPool) compactFree() {
	p.free = p.free[:0]
	for i := len(p.state) - 1; i >= 0; i-- {
		if p.state[i] == slotFree {
			p.free = append(p.free, int32(i))
		}
	}
}

// touch makes a live slot warmest.
func (p *slotPool) touch(s int32, at uint64) {
	if p.state[s] != slotLive {
		return
	}
	p.access[s] = at
	p.unlink(s)
	p.pushTail(s)
}

// release frees a live slot (reclaimed or deleted; its index entry is
// already gone).
func (p *slotPool) release(s int32) {
	if p.state[s] != slotLive {
		panic(fmt.Sprintf("l3disk: release of slot %d in state %s, want live", s, p.state[s]))
	}
	p.unlink(s)
	delete(p.byHash, p.hash[s])
	p.state[s] = slotFree
	p.live--
	p.free = append(p.free, s)
}

func (p *slotPool) pushTail(s int32) {
	p.prev[s], p.next[s] = p.tail, noSlot
	if p.tail != noSlot {
		p.next[p.tail] = s
	} else {
		p.head = s
	}
	p.tail = s
}

func (p *slotPool) unlink(s int32) {
	pr, nx := p.prev[s], p.next[s]
	if pr != noSlot {
		p.next[pr] = nx
	} else {
		p.head = nx
	}
	if nx != noSlot {
		p.prev[nx] = pr
	} else {
		p.tail = pr
	}
	p.prev[s], p.next[s] = noSlot, noSlot
}

// check verifies the pool's invariants: every slot is in exactly one of
// free list, in flight or LRU list; byHash is the inverse of non-free
// hashes; the LRU is ordered by access time. It returns the first
// violation found.
func (p *slotPool) check() error {
	n := len(p.state)
	seen := make([]uint8, n)
	for _, s := range p.free {
		if s < 0 || int(s) >= n {
			return fmt.Errorf("free list holds slot %d out of [0, %d)", s, n)
		}
		if p.state[s] != slotFree {
			return fmt.Errorf("free list holds slot %d in state %s", s, p.state[s])
		}
		seen[s]++
	}
	live := 0
	prevAt := uint64(0)
	last := noSlot
	for s := p.head; s != noSlot; s = p.next[s] {
		if p.state[s] != slotLive {
			return fmt.Errorf("lru holds slot %d in state %s", s, p.state[s])
		}
		if p.prev[s] != last {
			return fmt.Errorf("lru slot %d prev %d, want %d", s, p.prev[s], last)
		}
		if p.access[s] < prevAt {
			return fmt.Errorf("lru slot %d accessed at %d after a slot accessed at %d", s, p.access[s], prevAt)
		}
		prevAt = p.access[s]
		seen[s]++
		live++
		last = s
		if live > n {
			return fmt.Errorf("lru has a cycle")
		}
	}
	if last != p.tail {
		return fmt.Errorf("lru tail %d, walk ended at %d", p.tail, last)
	}
	if live != p.live {
		return fmt.Errorf("lru has %d slots, live count %d", live, p.live)
	}
	inFlight := 0
	for s := range n {
		switch p.state[s] {
		case slotInFlight:
			seen[s]++
			inFlight++
		case slotFree:
			continue
		}
		if seen[s] != 1 {
			return fmt.Errorf("slot %d (%s) is on %d lists, want 1", s, p.state[s], seen[s])
		}
		if got, ok := p.byHash[p.hash[s]]; !ok || got != int32(s) {
			return fmt.Errorf("slot %d holds hash %s, index maps it to %d (%v)", s, p.hash[s].Short(), got, ok)
		}
	}
	for s := range n {
		if p.state[s] == slotFree && seen[s] != 1 {
			return fmt.Errorf("free slot %d is on the free list %d times", s, seen[s])
		}
	}
	if len(p.byHash) != live+inFlight {
		return fmt.Errorf("hash map has %d entries, live %d + in flight %d", len(p.byHash), live, inFlight)
	}
	return nil
}

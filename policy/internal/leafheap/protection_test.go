package leafheap

import (
	"testing"

	"github.com/kvtier/kvtier/policy"
)

func TestProtection(t *testing.T) {
	p := Protection{Share: 0.5}
	// Three nodes of 2 pages; slots 0 and 1 protected at times 5 and 3.
	for range 3 {
		p.Resize(2, false)
	}
	p.Protect(2)
	p.Touch(0, 10, 5)
	if _, _, ok := p.Overfull(); ok {
		t.Fatal("2 of 6 pages protected is within a 0.5 share")
	}
	p.Protect(2)
	p.Touch(1, 11, 3)
	slot, id, ok := p.Overfull()
	if !ok || slot != 1 || id != 11 {
		t.Fatalf("Overfull = %d, %d, %v; want the least recently used protected node (slot 1, id 11)", slot, id, ok)
	}
	p.Demote(slot, 2)
	if _, _, ok := p.Overfull(); ok {
		t.Fatal("still overfull after demoting one node")
	}
	if msg := p.Check(); msg != "" {
		t.Fatal(msg)
	}
	// A protected node growing by 4 pages pushes the segment over the share.
	p.Resize(4, true)
	if slot, _, ok := p.Overfull(); !ok || slot != 0 {
		t.Fatalf("after growth: Overfull = %d, %v; want slot 0", slot, ok)
	}
	if msg := p.Check(); msg == "" {
		t.Fatal("Check accepted protected pages over the share")
	}
	p.Forget(0, 6, true)
	if p.Pages() != 4 {
		t.Fatalf("pages after forgetting slot 0 = %d, want 4", p.Pages())
	}
	if msg := p.Check(); msg != "" {
		t.Fatal(msg)
	}
}

type testNode struct {
	pages     int64
	last      uint64
	protected bool
}

func demoteTestNode(v *testNode) (int64, Key) {
	v.protected = false
	return v.pages, Key{A: 0, B: v.last}
}

// TestDemoteOverfull checks the shared demotion loop: least recently used
// first, only until the share holds, evictable nodes re-keyed, the others
// left out of the victim heap.
func TestDemoteOverfull(t *testing.T) {
	nodes := NewTable[testNode]()
	var victims Heap
	p := Protection{Share: 0.25}
	// Four protected nodes of 2 pages, last accesses 4, 1, 3, 2; ids
	// 1-4 are evictable leaves except id 2.
	for i, last := range []uint64{4, 1, 3, 2} {
		id := policy.NodeID(i + 1)
		slot, _ := nodes.Add(id)
		*nodes.At(slot) = testNode{pages: 2, last: last, protected: true}
		p.Resize(2, false)
		p.Protect(2)
		p.Touch(slot, id, last)
		if id != 2 {
			victims.Set(slot, id, Key{A: 1, B: last})
		}
	}
	DemoteOverfull(&p, nodes, &victims, demoteTestNode)
	// 8 pages, share 0.25: two protected pages may stay, so the three
	// least recently used (ids 2, 4, 3) are demoted and id 1 stays.
	for id, want := range map[policy.NodeID]bool{1: true, 2: false, 3: false, 4: false} {
		slot, _ := nodes.Lookup(id)
		if got := nodes.At(slot).protected; got != want {
			t.Errorf("id %d protected = %v, want %v", id, got, want)
		}
		k, in := victims.Key(slot)
		switch {
		case id == 2 && in:
			t.Errorf("id 2 is not evictable, yet demotion put it in the victim heap")
		case id != 2 && !want && (!in || k.A != 0):
			t.Errorf("id %d was demoted but its victim key is %+v (in heap %v), want class 0", id, k, in)
		case want && k.A != 1:
			t.Errorf("id %d stayed protected but its victim key changed to %+v", id, k)
		}
	}
	if msg := p.Check(); msg != "" {
		t.Fatal(msg)
	}
}

package segmented

import (
	"testing"

	"github.com/kvtier/kvtier/policy"
)

type testNode struct{ probation uint64 }

func testClass(v *testNode) uint64 { return v.probation }

// TestDemotion checks the demotion loop: least recently used first, only
// until the share holds, evictable nodes re-keyed with their unprotected
// class, the others left out of the victim heap.
func TestDemotion(t *testing.T) {
	c := New(0.25, 9, testClass)
	// Four protected nodes of 2 pages, last accesses 4, 1, 3, 2; ids
	// 1-4 are evictable leaves except id 2. Share 1 while they are added.
	c.prot.Share = 1
	for i, last := range []uint64{4, 1, 3, 2} {
		id := policy.NodeID(i + 1)
		slot, _ := c.Add(id)
		c.At(slot).probation = uint64(i)
		c.Apply(slot, id, 2, last, true)
		if id != 2 {
			c.SetEvictable(id, true)
		}
	}
	for id := range policy.NodeID(4) {
		if class, _ := c.Class(id + 1); class != 9 {
			t.Fatalf("id %d: class %d before demotion, want 9", id+1, class)
		}
	}
	c.prot.Share = 0.25
	c.demote()
	// 8 pages, share 0.25: two protected pages may stay, so the three
	// least recently used (ids 2, 4, 3) are demoted and id 1 stays.
	for id, want := range map[policy.NodeID]bool{1: true, 2: false, 3: false, 4: false} {
		slot, _ := c.Lookup(id)
		if got := c.Protected(slot); got != want {
			t.Errorf("id %d protected = %v, want %v", id, got, want)
		}
		k, in := c.victims.Key(slot)
		switch {
		case id == 2 && in:
			t.Errorf("id 2 is not evictable, yet demotion put it in the victim heap")
		case id != 2 && !want && (!in || k.A != uint64(id-1)):
			t.Errorf("id %d was demoted but its victim key is %+v (in heap %v), want class %d", id, k, in, id-1)
		case want && k.A != 9:
			t.Errorf("id %d stayed protected but its victim key changed to %+v", id, k)
		}
	}
	if msg := c.Check(); msg != "" {
		t.Fatal(msg)
	}
	// Victim order: class first (id 3 has class 2, id 4 class 3, id 1
	// is protected). Removing id 3 leaves id 1 over the share: it is
	// demoted to class 0 and goes next.
	for _, want := range []policy.NodeID{3, 1, 4} {
		if id, ok := c.Victim(); !ok || id != want {
			t.Fatalf("victim %d, %v; want %d", id, ok, want)
		}
		c.Remove(want)
	}
	if id, ok := c.Victim(); ok {
		t.Fatalf("victim %d after every evictable leaf was removed", id)
	}
	if msg := c.Check(); msg != "" {
		t.Fatal(msg)
	}
}

// TestUnprotect checks that Unprotect leaves the key to the next Apply.
func TestUnprotect(t *testing.T) {
	c := New(1, 9, testClass)
	slot, _ := c.Add(7)
	c.Apply(slot, 7, 3, 10, true)
	c.SetEvictable(7, true)
	c.Unprotect(slot)
	if c.Protected(slot) {
		t.Fatal("node still protected after Unprotect")
	}
	c.Apply(slot, 7, 3, 11, false)
	if class, ok := c.Class(7); !ok || class != 0 {
		t.Fatalf("class %d, %v after Unprotect and Apply; want 0, true", class, ok)
	}
	if msg := c.Check(); msg != "" {
		t.Fatal(msg)
	}
	if c.CachedPages() != 3 || c.Pages(slot) != 3 || c.LastAccess(slot) != 11 {
		t.Fatalf("pages %d/%d, last access %d; want 3/3, 11", c.CachedPages(), c.Pages(slot), c.LastAccess(slot))
	}
}

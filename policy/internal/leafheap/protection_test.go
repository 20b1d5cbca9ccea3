package leafheap

import "testing"

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

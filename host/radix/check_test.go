package radix

import (
	"strings"
	"testing"
)

// brokenLRU is a fault-injecting evictor for this test only: a test LRU
// whose self-check reports a broken invariant.
type brokenLRU struct{ *testLRU }

func (brokenLRU) Check() string { return "heap order broken at slot 3" }

// TestCheckRunsEvictorSelfCheck: the tree's Check reports the evictor's own
// invariant failure, naming the evictor.
func TestCheckRunsEvictorSelfCheck(t *testing.T) {
	tree, err := New(Options{PageTokens: 2, Tiers: 1, Residency: L1}, brokenLRU{newTestLRU()})
	if err != nil {
		t.Fatal(err)
	}
	err = tree.Check()
	if err == nil || !strings.Contains(err.Error(), "evictor test-lru: heap order broken at slot 3") {
		t.Fatalf("Check() = %v, want the evictor's failure", err)
	}
}

// TestCheckFindsCorruption: Check names what it expected and found when
// the tree's own bookkeeping is corrupted (here by the test, reaching into
// unexported fields).
func TestCheckFindsCorruption(t *testing.T) {
	for _, c := range []struct {
		name    string
		corrupt func(*Tree)
		want    string
	}{
		{"page count", func(tr *Tree) { tr.pages++ }, "tree counts 4 pages, nodes hold 3"},
		{"negative lock", func(tr *Tree) { tr.Node(1).lockRefs = -1 }, "negative lock refs -1"},
		{"tokens vs pages", func(tr *Tree) { tr.Node(1).tokens = []uint32{1} }, "has 3 pages (hashes) but 1 tokens, want 6"},
		{"evictable flag", func(tr *Tree) { tr.Node(1).evictable = false }, "reported evictable=false, want true"},
		{"depth", func(tr *Tree) { tr.Node(1).depth = 5 }, "depth 5, parent 0 ends at page 0"},
		{"residency", func(tr *Tree) { tr.Node(1).residency = 0 }, "at least one tier"},
	} {
		lru := newTestLRU()
		tr, err := New(Options{PageTokens: 2, Tiers: 2, Residency: L1}, lru)
		if err != nil {
			t.Fatal(err)
		}
		tr.InsertTokens([]uint32{1, 2, 3, 4, 5, 6})
		if err := tr.Check(); err != nil {
			t.Fatalf("%s: clean tree: %v", c.name, err)
		}
		c.corrupt(tr)
		if err := tr.Check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Check() = %v, want one containing %q", c.name, err, c.want)
		}
	}
}

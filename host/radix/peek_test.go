package radix

import (
	"strings"
	"testing"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
)

// TestPeekHashesIsNotAMatch: PeekHashes finds the same path as MatchHashes
// (splitting where the prefix ends inside a node) but leaves the clock,
// the hit counts, the last accesses and the evictor's recency alone.
func TestPeekHashesIsNotAMatch(t *testing.T) {
	key := func(ids ...byte) []pagehash.Hash {
		hs := make([]pagehash.Hash, len(ids))
		for i, id := range ids {
			hs[i][0] = id
		}
		return hs
	}
	for _, c := range []struct {
		name      string
		peek      []pagehash.Hash
		wantPages int
		wantNodes int // path length
		wantSplit bool
	}{
		{"absent", key(9, 9), 0, 0, false},
		{"whole node", key(1, 2, 3), 3, 1, false},
		{"into the child", key(1, 2, 3, 4), 4, 2, true},
		{"whole path", key(1, 2, 3, 4, 5), 5, 2, false},
		{"ends inside a node", key(1, 2), 2, 1, true},
		{"diverges inside a node", key(1, 2, 7), 2, 1, true},
		{"longer than the tree", key(1, 2, 3, 4, 5, 6, 7), 5, 2, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ev := newTestLRU()
			tree, err := New(Options{PageTokens: 4, Tiers: 1, Residency: L1}, ev)
			if err != nil {
				t.Fatal(err)
			}
			tree.InsertHashes(key(1, 2, 3))
			tree.InsertHashes(key(1, 2, 3, 4, 5))
			tree.MatchHashes(key(1, 2, 3), nil) // some hits to keep
			clock, nodes := tree.Clock(), tree.Nodes()
			type state struct{ hits, last uint64 }
			before := map[int]state{}
			for id := range int(tree.nextID) {
				if n := tree.Node(policy.NodeID(id)); n != nil {
					before[id] = state{n.hits, n.lastAccess}
				}
			}
			ev.record = true
			path, pages := tree.PeekHashes(c.peek, nil)
			if pages != c.wantPages || len(path) != c.wantNodes {
				t.Fatalf("peek: %d pages on %d nodes, want %d on %d", pages, len(path), c.wantPages, c.wantNodes)
			}
			if got := tree.Clock(); got != clock {
				t.Errorf("clock %d, want %d (a peek is not a match)", got, clock)
			}
			if split := tree.Nodes() != nodes; split != c.wantSplit {
				t.Errorf("split %t, want %t", split, c.wantSplit)
			}
			for _, e := range ev.log {
				if strings.HasPrefix(e, "hit ") {
					t.Errorf("the evictor heard a hit: %s", e)
				}
			}
			for id := range int(tree.nextID) {
				n := tree.Node(policy.NodeID(id))
				if n == nil {
					continue
				}
				b, ok := before[id]
				if !ok {
					// The prefix half of a split carries its child's.
					b = before[int(n.kids[0].id)]
				}
				if b.hits != n.hits || b.last != n.lastAccess {
					t.Errorf("node %d: hits %d, last access %d; want %d, %d", n.id, n.hits, n.lastAccess, b.hits, b.last)
				}
			}
			if len(path) > 0 {
				last := path[len(path)-1]
				if got := last.depth + len(last.hashes); got != pages {
					t.Errorf("path ends at page %d, want %d: its last node must hold exactly the prefix", got, pages)
				}
			}
			// MatchHashes finds the same path.
			mpath, mpages := tree.MatchHashes(c.peek, nil)
			if mpages != pages || len(mpath) != len(path) {
				t.Fatalf("match: %d pages on %d nodes, peek %d on %d", mpages, len(mpath), pages, len(path))
			}
			for i := range path {
				if mpath[i] != path[i] {
					t.Errorf("path node %d: match %d, peek %d", i, mpath[i].id, path[i].id)
				}
			}
			if err := tree.Check(); err != nil {
				t.Error(err)
			}
		})
	}
}

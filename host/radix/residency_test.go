package radix

import (
	"math/rand/v2"
	"testing"
)

func TestResidentPages(t *testing.T) {
	r := newReplica(t)
	pool := newKeyPool(rand.New(rand.NewPCG(3, 3)))
	key := pool.bases[0][:4]
	r.tree.InsertHashes(key[:1])
	r.tree.InsertHashes(key[:3])
	r.tree.InsertHashes(key)
	path, pages := r.tree.MatchHashes(key, nil)
	if len(path) != 3 || pages != 4 {
		t.Fatalf("path of %d nodes, %d pages; want 3 nodes, 4 pages", len(path), pages)
	}
	// path pages: 1, 2, 1.
	if err := r.tree.SetResidency(path[0], L1|L2); err != nil {
		t.Fatal(err)
	}
	if err := r.tree.SetResidency(path[1], L2); err != nil {
		t.Fatal(err)
	}
	if err := r.tree.SetResidency(path[2], L1|L2|L3); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ tier, want int }{{1, 1}, {2, 4}, {3, 0}, {4, 0}, {0, 0}} {
		if got := ResidentPages(path, c.tier); got != c.want {
			t.Errorf("ResidentPages(L%d) = %d, want %d", c.tier, got, c.want)
		}
	}
	if r.tree.TierPages(1) != 2 || r.tree.TierPages(2) != 4 || r.tree.TierPages(3) != 1 {
		t.Errorf("tier pages L1=%d L2=%d L3=%d, want 2, 4, 1", r.tree.TierPages(1), r.tree.TierPages(2), r.tree.TierPages(3))
	}
	if err := r.tree.Check(); err != nil {
		t.Fatal(err)
	}
}

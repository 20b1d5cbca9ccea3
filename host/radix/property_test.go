package radix

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/kvtier/kvtier/pagehash"
)

// keyPool makes keys that share prefixes the way real traffic does: each
// key is a prefix of one of a few base sequences, sometimes with a private
// extension.
type keyPool struct {
	bases [][]pagehash.Hash
	rng   *rand.Rand
	fresh uint64
}

func newKeyPool(rng *rand.Rand) *keyPool {
	p := &keyPool{rng: rng}
	// NB: more bases than kidListMax, so the root's children go to a map.
	for b := range 14 {
		n := 4 + rng.IntN(20)
		hs := make([]pagehash.Hash, n)
		prev := pagehash.Root
		for i := range hs {
			prev = pagehash.Next(prev, []uint32{uint32(b), uint32(i)})
			hs[i] = prev
		}
		p.bases = append(p.bases, hs)
	}
	return p
}

func (p *keyPool) key() []pagehash.Hash {
	base := p.bases[p.rng.IntN(len(p.bases))]
	key := append([]pagehash.Hash(nil), base[:1+p.rng.IntN(len(base))]...)
	if p.rng.IntN(3) == 0 {
		for range 1 + p.rng.IntN(4) {
			p.fresh++
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], p.fresh)
			key = append(key, pagehash.Hash(sha256.Sum256(b[:])))
		}
	}
	return key
}

// replica is one tree with the model of its content: the set of page
// hashes it holds, maintained from insert results and eviction victims
// only, as an oracle for Match.
type replica struct {
	// borrow: insert with InsertHashesBorrowed (the keys are never
	// written again), so one replica exercises the no-copy path.
	borrow  bool
	tree    *Tree
	lru     *testLRU
	present map[pagehash.Hash]bool
	locked  []*Node
}

func newReplica(t *testing.T) *replica {
	lru := newTestLRU()
	tree, err := New(Options{PageTokens: 2, Tiers: 3, Residency: L1}, lru)
	if err != nil {
		t.Fatal(err)
	}
	return &replica{tree: tree, lru: lru, present: map[pagehash.Hash]bool{}}
}

// TestReplicasAgree applies the same random op streams to two replicas
// (one copying keys at insert, one borrowing them) and asserts equal
// digests after every op, equal results, Match equal to
// the longest present prefix of the model, and Check clean throughout.
func TestReplicasAgree(t *testing.T) {
	seeds := uint64(30)
	if raceBuild {
		seeds = 6 // the tree has no goroutines; the full run is the plain pass
	}
	for seed := uint64(1); seed <= seeds; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0x5eed))
		pool := newKeyPool(rng)
		a, b := newReplica(t), newReplica(t)
		b.borrow = true
		for step := range 300 {
			op := rng.IntN(10)
			key := pool.key()
			n1 := rng.IntN(12)
			pick := rng.IntN(1 << 20)
			ra := a.apply(t, op, key, n1, pick)
			rb := b.apply(t, op, key, n1, pick)
			if ra != rb {
				t.Fatalf("seed %d step %d op %d: replicas answered %q and %q", seed, step, op, ra, rb)
			}
			if a.tree.Digest() != b.tree.Digest() {
				t.Fatalf("seed %d step %d op %d: digests differ", seed, step, op)
			}
			if err := a.tree.Check(); err != nil {
				t.Fatalf("seed %d step %d op %d: %v", seed, step, op, err)
			}
			if a.tree.Pages() != len(a.present) {
				t.Fatalf("seed %d step %d: tree holds %d pages, model %d", seed, step, a.tree.Pages(), len(a.present))
			}
		}
	}
}

// apply runs one op and returns a printable result for comparison.
func (r *replica) apply(t *testing.T, op int, key []pagehash.Hash, n, pick int) string {
	t.Helper()
	tr := r.tree
	switch op {
	case 0, 1, 2:
		path, pages := tr.MatchHashes(key, nil)
		want := 0
		for want < len(key) && r.present[key[want]] {
			want++
		}
		if pages != want {
			t.Fatalf("match: tree %d pages, model %d", pages, want)
		}
		sum := 0
		for _, p := range path {
			sum += p.Pages()
		}
		if sum != pages {
			t.Fatalf("match: path holds %d pages, reported %d", sum, pages)
		}
		return "match " + itoa(pages)
	case 3, 4:
		insert := tr.InsertHashes
		if r.borrow {
			insert = tr.InsertHashesBorrowed
		}
		last, added := insert(key)
		for _, h := range key {
			r.present[h] = true
		}
		if len(key) > 0 && last.Hashes()[last.Pages()-1] != key[len(key)-1] {
			t.Fatalf("insert: last node does not end with the key's last page")
		}
		if rng := pick % 3; rng == 0 && last != tr.Root() {
			if err := tr.Lock(last); err != nil {
				t.Fatal(err)
			}
			r.locked = append(r.locked, last)
		}
		return "insert " + itoa(added)
	case 5:
		if len(r.locked) == 0 {
			return "no lock"
		}
		i := pick % len(r.locked)
		n := r.locked[i]
		r.locked = append(r.locked[:i], r.locked[i+1:]...)
		if err := tr.Unlock(n); err != nil {
			t.Fatal(err)
		}
		return "unlock"
	case 6, 7:
		victims, freed, err := tr.EvictPages(n, nil)
		if err != nil {
			t.Fatal(err)
		}
		sum := 0
		for _, v := range victims {
			sum += v.Pages
			for _, h := range v.Hashes {
				delete(r.present, h)
			}
		}
		if sum != freed || freed > n {
			t.Fatalf("evict %d: victims hold %d pages, freed %d", n, sum, freed)
		}
		return "evict " + itoa(freed)
	case 8:
		node := r.nodeAt(pick)
		if node == nil {
			return "no node"
		}
		hs := subtreeHashes(node)
		pages, err := tr.Prune(node)
		if errors.Is(err, ErrLocked) || errors.Is(err, ErrBackupPending) {
			return "prune refused"
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hs {
			delete(r.present, h)
		}
		return "prune " + itoa(pages)
	default:
		node := r.nodeAt(pick)
		if node == nil {
			return "no node"
		}
		err := tr.SetBackupPending(node, !node.BackupPending())
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.SetResidency(node, Residency(1+pick%7)); err != nil {
			t.Fatal(err)
		}
		return "marker"
	}
}

// nodeAt picks a live node deterministically: the pick-th by id.
func (r *replica) nodeAt(pick int) *Node {
	if r.tree.Nodes() == 0 {
		return nil
	}
	var ids []*Node
	var walk func(n *Node)
	walk = func(n *Node) {
		for _, c := range n.sortedChildren() {
			ids = append(ids, c)
			walk(c)
		}
	}
	walk(r.tree.Root())
	return ids[pick%len(ids)]
}

func subtreeHashes(n *Node) []pagehash.Hash {
	out := append([]pagehash.Hash(nil), n.Hashes()...)
	for _, c := range n.sortedChildren() {
		out = append(out, subtreeHashes(c)...)
	}
	return out
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	if n == 0 {
		return "0"
	}
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}

// TestDigestSeesDivergence: one extra hit on one replica changes the
// digest, and so does a marker.
func TestDigestSeesDivergence(t *testing.T) {
	a, b := newReplica(t), newReplica(t)
	pool := newKeyPool(rand.New(rand.NewPCG(7, 7)))
	key := pool.key()
	a.tree.InsertHashes(key)
	b.tree.InsertHashes(key)
	if a.tree.Digest() != b.tree.Digest() {
		t.Fatal("equal trees have different digests")
	}
	a.tree.MatchHashes(key, nil)
	if a.tree.Digest() == b.tree.Digest() {
		t.Fatal("digest did not change after a hit")
	}
	b.tree.MatchHashes(key, nil)
	if a.tree.Digest() != b.tree.Digest() {
		t.Fatal("digests differ after the same hit")
	}
	n := a.tree.Node(1)
	if err := a.tree.SetBackupPending(n, true); err != nil {
		t.Fatal(err)
	}
	if a.tree.Digest() == b.tree.Digest() {
		t.Fatal("digest did not change with the backup-pending marker")
	}
}

// TestFirstWordClash: children whose first pages share their first 8
// bytes (the child map's key) are still told apart, found, split and
// removed correctly.
func TestFirstWordClash(t *testing.T) {
	r := newReplica(t)
	mk := func(i int, tail byte) pagehash.Hash {
		var h pagehash.Hash
		h[0] = byte(i % 3) // only three distinct first words
		h[8] = byte(i)
		h[31] = tail
		return h
	}
	var keys [][]pagehash.Hash
	for i := range 20 {
		keys = append(keys, []pagehash.Hash{mk(i, 0), mk(i, 1), mk(i, 2)})
		r.tree.InsertHashes(keys[i])
	}
	if err := r.tree.Check(); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if _, pages := r.tree.MatchHashes(k[:2], nil); pages != 2 {
			t.Fatalf("key %d: matched %d pages, want 2", i, pages)
		}
	}
	if r.tree.Root().Children() != 20 || r.tree.Nodes() != 40 {
		t.Fatalf("root has %d children, tree %d nodes; want 20 and 40", r.tree.Root().Children(), r.tree.Nodes())
	}
	if err := r.tree.Check(); err != nil {
		t.Fatal(err)
	}
	_, freed, err := r.tree.EvictPages(60, nil)
	if err != nil || freed != 60 || r.tree.Nodes() != 0 {
		t.Fatalf("evict all: freed %d, err %v, %d nodes left", freed, err, r.tree.Nodes())
	}
	if err := r.tree.Check(); err != nil {
		t.Fatal(err)
	}
}

package radix

import (
	"math/rand/v2"
	"testing"

	"github.com/kvtier/kvtier/pagehash"
)

// TestTokensMatchHashes is a metamorphic test: the same random op stream
// applied to a tree keyed by tokens and to a tree keyed by the tokens'
// page hashes gives the same matches, node ids, shapes and victims; and a
// token match also works across nodes that were inserted from hashes.
func TestTokensMatchHashes(t *testing.T) {
	const pt = 3
	for seed := uint64(1); seed <= 25; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		// A few base token sequences; keys are prefixes of them, some
		// with a partial trailing page or a divergent tail.
		var bases [][]uint32
		for range 5 {
			b := make([]uint32, pt*(2+rng.IntN(12)))
			for i := range b {
				b[i] = uint32(rng.IntN(4)) // small alphabet: shared pages under different prefixes
			}
			bases = append(bases, b)
		}
		key := func() []uint32 {
			b := bases[rng.IntN(len(bases))]
			k := append([]uint32(nil), b[:1+rng.IntN(len(b))]...)
			if rng.IntN(3) == 0 {
				for range 1 + rng.IntN(2*pt) {
					k = append(k, uint32(100+rng.IntN(3)))
				}
			}
			return k
		}
		tok, hsh := newReplica(t), newReplica(t)
		tok.tree.opts.PageTokens, hsh.tree.opts.PageTokens = pt, pt
		mixed := newReplica(t) // inserted from hashes, matched by tokens
		mixed.tree.opts.PageTokens = pt
		for step := range 200 {
			k := key()
			hs := pagehash.Chain(nil, pagehash.Root, k, pt)
			switch rng.IntN(4) {
			case 0, 1:
				pa, na := tok.tree.MatchTokens(k, nil)
				pb, nb := hsh.tree.MatchHashes(hs, nil)
				pc, nc := mixed.tree.MatchTokens(k, nil)
				if na != nb || nb != nc || len(pa) != len(pb) || len(pb) != len(pc) {
					t.Fatalf("seed %d step %d: token match %d pages (%d nodes), hash match %d (%d), mixed %d (%d)",
						seed, step, na, len(pa), nb, len(pb), nc, len(pc))
				}
				for i := range pa {
					if pa[i].ID() != pb[i].ID() || pb[i].ID() != pc[i].ID() {
						t.Fatalf("seed %d step %d: path node %d ids %d/%d/%d", seed, step, i, pa[i].ID(), pb[i].ID(), pc[i].ID())
					}
				}
			case 2:
				la, aa := tok.tree.InsertTokens(k)
				lb, ab := hsh.tree.InsertHashes(hs)
				lc, ac := mixed.tree.InsertHashes(hs)
				if aa != ab || ab != ac || la.ID() != lb.ID() || lb.ID() != lc.ID() {
					t.Fatalf("seed %d step %d: insert added %d/%d/%d, last %d/%d/%d", seed, step, aa, ab, ac, la.ID(), lb.ID(), lc.ID())
				}
				if la != tok.tree.Root() {
					for i, h := range la.Hashes() {
						if h != lb.Hashes()[i] {
							t.Fatalf("seed %d step %d: token node hash %d differs from Chain", seed, step, i)
						}
					}
				}
			default:
				n := rng.IntN(8)
				va, fa, err := tok.tree.EvictPages(n, nil)
				if err != nil {
					t.Fatal(err)
				}
				vb, fb, _ := hsh.tree.EvictPages(n, nil)
				vc, fc, _ := mixed.tree.EvictPages(n, nil)
				if fa != fb || fb != fc || len(va) != len(vb) || len(vb) != len(vc) {
					t.Fatalf("seed %d step %d: evicted %d/%d/%d pages", seed, step, fa, fb, fc)
				}
			}
			for _, r := range []*replica{tok, hsh, mixed} {
				if err := r.tree.Check(); err != nil {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
			}
		}
		if tok.tree.Nodes() == 0 && hsh.tree.Nodes() == 0 {
			continue
		}
		if hsh.tree.Digest() != mixed.tree.Digest() {
			t.Fatalf("seed %d: hash tree and mixed tree digests differ", seed)
		}
	}
}

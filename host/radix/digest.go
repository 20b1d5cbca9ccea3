package radix

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"slices"
)

// digestVersion prefixes the canonical encoding; a change of the encoding
// is a new version.
const digestVersion = "kvtier.radix.digest.v1"

// Digest returns the SHA-256 of the tree's canonical replicated state: the
// logical clock, the next node id, and every node in pre-order with
// children ordered by first page hash — its id, parent id, depth, page
// hashes, tokens, hit count, last access, request lock refs, backup-pending
// marker and residency. Two replicas that applied the same calls in the
// same order have equal digests; any divergence changes it.
func (t *Tree) Digest() [sha256.Size]byte {
	d := sha256.New()
	d.Write([]byte(digestVersion))
	var buf [8]byte
	put := func(v uint64) {
		binary.LittleEndian.PutUint64(buf[:], v)
		d.Write(buf[:])
	}
	put(t.clock)
	put(uint64(t.nextID))
	put(uint64(t.opts.PageTokens))
	put(uint64(t.byID.Len()))
	t.digestNode(d, put, t.root)
	var out [sha256.Size]byte
	d.Sum(out[:0])
	return out
}

func (t *Tree) digestNode(d hash.Hash, put func(uint64), n *Node) {
	put(uint64(n.id))
	if n.parent != nil {
		put(uint64(n.parent.id))
	} else {
		put(0)
	}
	put(uint64(n.depth))
	put(uint64(len(n.hashes)))
	for i := range n.hashes {
		d.Write(n.hashes[i][:])
	}
	put(uint64(len(n.tokens)))
	var tb [4]byte
	for _, tok := range n.tokens {
		binary.LittleEndian.PutUint32(tb[:], tok)
		d.Write(tb[:])
	}
	put(n.hits)
	put(n.lastAccess)
	put(uint64(n.lockRefs))
	marker := uint64(0)
	if n.backupPending {
		marker = 1
	}
	put(marker)
	put(uint64(n.residency))
	kids := n.sortedChildren()
	slices.SortFunc(kids, func(a, b *Node) int { return bytes.Compare(a.hashes[0][:], b.hashes[0][:]) })
	put(uint64(len(kids)))
	for _, c := range kids {
		t.digestNode(d, put, c)
	}
}

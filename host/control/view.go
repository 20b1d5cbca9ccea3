package control

import (
	"github.com/kvtier/kvtier/host/radix"
	"github.com/kvtier/kvtier/pagehash"
)

// PageRef is one page of a request's matched path as the engine reads it:
// its key and the L1 page that holds it.
type PageRef struct {
	// Hash is the page's key.
	Hash pagehash.Hash
	// L1 is the L1 page index.
	L1 int64
}

// MatchedL1 appends to dst the leading pages of the path req's lock is on
// that are resident in L1 (a load-back committed, not in flight), from the
// root, stopping at the first page that is not; this is what the engine
// reads for the request's prefix hit. It is a read-only view for drivers:
// it changes nothing and decides nothing. An unknown or unlocked request
// gives dst unchanged.
func (m *Machine) MatchedL1(req ReqID, dst []PageRef) []PageRef {
	r := m.reqs[req]
	if r == nil || r.lock == nil || r.lock.Removed() {
		return dst
	}
	var path []*radix.Node
	for n := r.lock; n != nil && n != m.tree.Root(); n = n.Parent() {
		path = append(path, n)
	}
	for i := len(path) - 1; i >= 0; i-- {
		n := path[i]
		k := m.marks.Get(n.ID())
		if k == nil || k.l1 == 0 || k.loadOp != 0 || !n.Residency().Has(1) {
			return dst
		}
		info, err := m.l1.Object(k.l1)
		if err != nil {
			return dst
		}
		hs := n.Hashes()
		j := 0
		for _, rg := range info.Ranges {
			for p := rg.Start; p < rg.Start+rg.Pages && j < len(hs); p++ {
				dst = append(dst, PageRef{Hash: hs[j], L1: p})
				j++
			}
		}
	}
	return dst
}

// Loading reports whether a load-back into L1 is in flight on the path
// req's lock is on: replicated state, so every rank of a group answers
// alike, and a driver can tell a request whose prefix is still coming
// (MatchedL1 stops at it) from one whose load failed. An unknown request
// is not loading.
func (m *Machine) Loading(req ReqID) bool {
	r := m.reqs[req]
	if r == nil || r.lock == nil || r.lock.Removed() {
		return false
	}
	for n := r.lock; n != nil && n != m.tree.Root(); n = n.Parent() {
		if k := m.marks.Get(n.ID()); k != nil && k.loadOp != 0 {
			return true
		}
	}
	return false
}

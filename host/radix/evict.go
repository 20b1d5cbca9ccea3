package radix

import (
	"fmt"
	"slices"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
)

// Victim is one eviction decision of EvictPages.
type Victim struct {
	// ID is the evicted or trimmed node.
	ID policy.NodeID
	// Pages is how many pages were freed from it.
	Pages int
	// Whole is true when the node left the tree, false when only its
	// tail was trimmed.
	Whole bool
	// Hashes are the freed pages' hashes (the node's tail when trimmed).
	// The slice is never written again by the tree.
	Hashes []pagehash.Hash
}

func (t *Tree) live(n *Node, what string) error {
	switch {
	case n == nil:
		return fmt.Errorf("radix: %s a nil node: %w", what, ErrNotInTree)
	case n == t.root:
		return fmt.Errorf("radix: %s the root: %w", what, ErrNotInTree)
	case n.removed:
		return fmt.Errorf("radix: %s node %d (evicted or pruned): %w", what, n.id, ErrNotInTree)
	}
	return nil
}

// Lock takes a request lock on n and every ancestor: none of them can be
// evicted or pruned until the matching Unlock. Locking the root is a no-op.
func (t *Tree) Lock(n *Node) error {
	if n == t.root {
		return nil
	}
	if err := t.live(n, "lock"); err != nil {
		return err
	}
	t.ops++
	for x := n; x != t.root; x = x.parent {
		x.lockRefs++
		if x.lockRefs == 1 {
			t.refresh(x)
		}
	}
	t.checkSampled()
	return nil
}

// Unlock releases a lock taken by Lock(n). A lock count never goes below
// zero: an unmatched Unlock changes nothing and returns ErrNotLocked.
func (t *Tree) Unlock(n *Node) error {
	if n == t.root {
		return nil
	}
	if err := t.live(n, "unlock"); err != nil {
		return err
	}
	for x := n; x != t.root; x = x.parent {
		if x.lockRefs <= 0 {
			return fmt.Errorf("radix: unlock node %d: ancestor %d has lock refs %d: %w", n.id, x.id, x.lockRefs, ErrNotLocked)
		}
	}
	t.ops++
	for x := n; x != t.root; x = x.parent {
		x.lockRefs--
		if x.lockRefs == 0 {
			t.refresh(x)
		}
	}
	t.checkSampled()
	return nil
}

// SetBackupPending sets (on) or clears the replicated backup-pending
// marker of n, which keeps n from being evicted or pruned until its
// backup commits or rolls back. Setting a set marker or clearing a clear
// one is an error (ErrMarker): it means two attaches or two commits. A
// split copies the marker to both halves, so the host clears it on every
// node that now covers the backed-up pages.
func (t *Tree) SetBackupPending(n *Node, on bool) error {
	if err := t.live(n, "set backup-pending on"); err != nil {
		return err
	}
	if n.backupPending == on {
		return fmt.Errorf("radix: set backup-pending=%t on node %d: %w", on, n.id, ErrMarker)
	}
	t.ops++
	n.backupPending = on
	t.refresh(n)
	t.checkSampled()
	return nil
}

// SetResidency records which tiers hold n's pages. It must name at least
// one configured tier: a node that no tier holds is evicted or pruned,
// not kept.
func (t *Tree) SetResidency(n *Node, r Residency) error {
	if err := t.live(n, "set residency on"); err != nil {
		return err
	}
	if err := t.opts.checkResidency(r); err != nil {
		return fmt.Errorf("radix: set residency on node %d: %w: %w", n.id, ErrResidency, err)
	}
	t.ops++
	t.addPages(n.residency, -len(n.hashes))
	n.residency = r
	t.addPages(n.residency, len(n.hashes))
	t.checkSampled()
	return nil
}

// EvictPages frees need pages by evicting the evictor's victims, leaf by
// leaf; the last victim is trimmed from its tail when it holds more pages
// than are still needed, so exactly need pages are freed if the evictable
// leaves (and the leaves they expose) hold that many. It appends one
// Victim per evicted or trimmed node to dst and returns it with the
// number of pages freed, which is less than need only when no evictable
// leaf is left. A victim that is not an evictable leaf is ErrBadVictim.
//
// With an evictor that ranks leaves by their tail page (TailRanker), a
// trim can move the victim in the policy's order, so each victim gives one
// page and the evictor is asked again: block-level semantics, one Victim
// per page.
func (t *Tree) EvictPages(need int, dst []Victim) ([]Victim, int, error) {
	freed := 0
	for freed < need {
		id, ok := t.ev.Victim()
		if !ok {
			break
		}
		n := t.byID.Get(id)
		if n == nil || !n.evictable {
			return dst, freed, fmt.Errorf("radix: evict %d pages: %s named node %d (in tree: %t): %w",
				need, t.ev.Name(), id, n != nil, ErrBadVictim)
		}
		t.ops++
		rem := need - freed
		if t.pageByPage {
			rem = 1
		}
		if len(n.hashes) <= rem {
			dst = append(dst, Victim{ID: n.id, Pages: len(n.hashes), Whole: true, Hashes: n.hashes})
			freed += len(n.hashes)
			t.remove(n, true)
			continue
		}
		keep := len(n.hashes) - rem
		dst = append(dst, Victim{ID: n.id, Pages: rem, Hashes: n.hashes[keep:]})
		freed += rem
		t.addPages(n.residency, -rem)
		n.hashes = n.hashes[:keep:keep]
		if n.tokens != nil {
			n.tokens = n.tokens[: keep*t.opts.PageTokens : keep*t.opts.PageTokens]
		}
		// NB: a heavily trimmed node gets its own small array so that it
		// does not pin the pages it no longer holds. The Victim keeps the
		// old array, which nothing writes again.
		if cap(n.hashes) > 2*keep+8 && !n.borrowed {
			n.hashes = slices.Clone(n.hashes)
		}
		if n.tokens != nil && cap(n.tokens) > 2*len(n.tokens)+8*t.opts.PageTokens {
			n.tokens = slices.Clone(n.tokens)
		}
		t.ev.Update(t.info(n))
	}
	t.checkSampled()
	return dst, freed, nil
}

// remove takes leaf n out of the tree and tells the evictor; with
// notifyParent it also reports the parent's new child count and state.
func (t *Tree) remove(n *Node, notifyParent bool) {
	p := n.parent
	p.removeChild(n)
	t.byID.Del(n.id)
	t.addPages(n.residency, -len(n.hashes))
	n.removed = true
	n.evictable = false
	t.ev.Remove(n.id)
	if notifyParent && p != t.root {
		t.ev.Update(t.info(p))
		t.refresh(p)
	}
}

// Prune removes n and its whole subtree and returns the pages removed. It
// refuses, changing nothing, when any node of the subtree holds a request
// lock (ErrLocked) or a pending backup (ErrBackupPending). Nodes leave
// deepest first, siblings in node-id order.
func (t *Tree) Prune(n *Node) (int, error) {
	if err := t.live(n, "prune"); err != nil {
		return 0, err
	}
	if err := t.prunable(n); err != nil {
		return 0, fmt.Errorf("radix: prune node %d: %w", n.id, err)
	}
	t.ops++
	pages := t.pruneRec(n, true)
	t.checkSampled()
	return pages, nil
}

func (t *Tree) prunable(n *Node) error {
	if n.lockRefs != 0 {
		return fmt.Errorf("node %d has %d lock refs: %w", n.id, n.lockRefs, ErrLocked)
	}
	if n.backupPending {
		return fmt.Errorf("node %d: %w", n.id, ErrBackupPending)
	}
	for _, c := range n.sortedChildren() {
		if err := t.prunable(c); err != nil {
			return err
		}
	}
	return nil
}

func (t *Tree) pruneRec(n *Node, top bool) int {
	pages := 0
	for _, c := range n.sortedChildren() {
		pages += t.pruneRec(c, false)
	}
	pages += len(n.hashes)
	// NB: only the subtree's top reports its parent; the others' parents
	// leave right after them.
	t.remove(n, top)
	return pages
}

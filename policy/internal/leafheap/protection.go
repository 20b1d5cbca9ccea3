package leafheap

import (
	"fmt"

	"github.com/kvtier/kvtier/policy"
)

// Protection is the capped protected segment of a segmented policy: it
// counts the pages of every cached node and of the protected ones, keeps
// the protected nodes in a heap by last access, and names the least
// recently used protected node while protected pages exceed Share of all
// pages. Its user (policy/internal/segmented) keeps each node's pages,
// tells Protection of every change, and takes a node's protection from
// Holds.
type Protection struct {
	// Share is the largest fraction of cached pages protected nodes may hold.
	Share     float64
	heap      Heap
	pages     int64
	protected int64
}

// Pages returns the pages of every cached node.
func (p *Protection) Pages() int64 { return p.pages }

// Resize accounts a node's change of pages by delta.
func (p *Protection) Resize(delta int64, protected bool) {
	p.pages += delta
	if protected {
		p.protected += delta
	}
}

// Holds reports whether the node at slot is in the segment: protected
// nodes are exactly those touched since they were protected and not yet
// demoted or forgotten.
func (p *Protection) Holds(slot int32) bool { return p.heap.Contains(slot) }

// Protect accounts a node of pages pages that has just become protected.
func (p *Protection) Protect(pages int64) { p.protected += pages }

// Touch sets a protected node's last access.
func (p *Protection) Touch(slot int32, id policy.NodeID, at uint64) {
	p.heap.Set(slot, id, Key{A: at})
}

// Forget accounts a node that left the cache.
func (p *Protection) Forget(slot int32, pages int64, protected bool) {
	p.pages -= pages
	if protected {
		p.protected -= pages
	}
	p.heap.Remove(slot)
}

// Overfull returns the least recently used protected node while protected
// pages exceed Share of all pages; the policy then demotes it (Demote).
func (p *Protection) Overfull() (slot int32, id policy.NodeID, ok bool) {
	if float64(p.protected) <= p.Share*float64(p.pages) {
		return 0, 0, false
	}
	slot, id, _, ok = p.heap.Min()
	return slot, id, ok
}

// Demote takes a protected node of pages pages out of the segment.
func (p *Protection) Demote(slot int32, pages int64) {
	p.heap.Remove(slot)
	p.protected -= pages
}

// Check verifies the segment's invariants; "" when they hold.
func (p *Protection) Check() string {
	if msg := p.heap.Check(); msg != "" {
		return "protected heap: " + msg
	}
	if p.protected < 0 || p.protected > p.pages {
		return fmt.Sprintf("protected pages %d outside [0, %d]", p.protected, p.pages)
	}
	if float64(p.protected) > p.Share*float64(p.pages) {
		return fmt.Sprintf("protected pages %d exceed share %.2f of %d", p.protected, p.Share, p.pages)
	}
	return ""
}

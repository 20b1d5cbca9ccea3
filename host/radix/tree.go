// Package radix is the replicated radix tree of a kvtier host: the index of
// which token pages are cached, where (per-tier residency), how hot they
// are, and which leaves may be evicted.
//
// A Tree is a pure, deterministic value: no goroutines, no I/O, no wall
// clock, no map-order dependence. Every rank of a context-parallel group
// holds a replica and applies the same calls in the same order, so every
// structural decision (split, evict, trim, prune) comes out the same; the
// canonical Digest lets ranks prove it. Decisions read only replicated
// fields: the tree shape, request lock refs (taken and released at
// replicated points), the backup-pending marker (separate from request
// locks) and the logical clock, a counter bumped once by every Match,
// Insert and Extend. Every order is total: ties are broken by node id, and node
// ids are assigned in creation order and never reused.
//
// Pages are identified by their prefix-chained page hash (package
// pagehash). A key given as tokens is hashed once, at insert; a key given
// as hashes (replay: one trace block = one page) is used as is. For every
// node, pages = len(hashes) = len(tokens)/page_tokens (when it has tokens):
// a node's key is never longer than its pages.
//
// The tree feeds an Evictor v1 (package policy) an event for every change
// and asks it for victims; eviction is leaf-only and can trim a leaf from
// its tail so that exactly the needed pages are freed.
//
// This package must never read rank-local state (acks, in-flight I/O,
// wall time) or do I/O; the controller does that and reports the
// replicated outcome through the setters.
package radix

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvtier/kvtier/internal/idtable"
	"github.com/kvtier/kvtier/internal/invariants"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
)

// Sentinel errors callers branch on.
var (
	// ErrLocked: the operation would remove a node that a request holds.
	ErrLocked = errors.New("node is locked by a request")
	// ErrBackupPending: the operation would remove a node whose backup is
	// still pending.
	ErrBackupPending = errors.New("node has a pending backup")
	// ErrNotInTree: the node was evicted or pruned, or is the root where a
	// real node is needed.
	ErrNotInTree = errors.New("node is not in the tree")
	// ErrNotLocked: Unlock without a matching Lock.
	ErrNotLocked = errors.New("node is not locked")
	// ErrMarker: the backup-pending marker is already in the requested
	// state (a double attach or a double clear).
	ErrMarker = errors.New("backup-pending marker already in that state")
	// ErrBadVictim: the evictor named a node that is not an evictable
	// leaf. This is a bug in the policy.
	ErrBadVictim = errors.New("evictor returned a node that is not an evictable leaf")
	// ErrResidency: a residency that names no tier or an unconfigured one.
	ErrResidency = errors.New("invalid residency")
)

// Tree is one replica of the radix tree. It is not safe for concurrent
// use: the host serialises calls, as every replica must see them in the
// same order.
type Tree struct {
	opts  Options
	ev    policy.Evictor
	root  *Node
	clock uint64
	// nextID is the id of the next node created; the root is id 0.
	nextID    policy.NodeID
	byID      idtable.Table[policy.NodeID, *Node]
	pages     int
	tierPages [MaxTiers]int
	// ops counts mutating calls, for sampling invariant checks.
	ops uint64
	// pageByPage: the evictor ranks leaves by their tail page.
	pageByPage bool
	// obs is the evictor when it observes finished requests, else nil.
	obs policy.RequestObserver
}

// TailRanker is an optional ability of an evictor. TailRanked reports
// that the evictor ranks a leaf by its tail page (the offline Belady
// oracle does: the tail's next use), so trimming a leaf can change its
// rank; EvictPages then frees that evictor's victims one page at a time.
// Evictors that rank a node by node-wide facts (recency, hits, queue
// position) need not implement it: every page of a node shares them, and
// freeing a victim's pages together is then the same decision as freeing
// them one by one.
type TailRanker interface {
	TailRanked() bool
}

// New returns an empty tree that reports to ev.
func New(opts Options, ev policy.Evictor) (*Tree, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if ev == nil {
		return nil, fmt.Errorf("radix: nil evictor")
	}
	root := &Node{residency: Residency(1<<opts.Tiers - 1)}
	tr, ok := ev.(TailRanker)
	obs, _ := ev.(policy.RequestObserver)
	return &Tree{
		obs:        obs,
		pageByPage: ok && tr.TailRanked(),
		opts:       opts,
		ev:         ev,
		root:       root,
		nextID:     1,
		byID:       idtable.New[policy.NodeID, *Node](1),
	}, nil
}

// Options returns the tree's options.
func (t *Tree) Options() Options { return t.opts }

// Root returns the root: it has no pages and is never evicted.
func (t *Tree) Root() *Node { return t.root }

// Clock returns the logical clock: the number of Match, Insert and Extend
// calls so far.
func (t *Tree) Clock() uint64 { return t.clock }

// Pages returns the number of pages in the tree.
func (t *Tree) Pages() int { return t.pages }

// TierPages returns the number of pages resident in tier (1-based).
func (t *Tree) TierPages(tier int) int {
	if tier < 1 || tier > MaxTiers {
		return 0
	}
	return t.tierPages[tier-1]
}

// Nodes returns the number of nodes, not counting the root.
func (t *Tree) Nodes() int { return t.byID.Len() }

// Node returns the live node with id, or nil.
func (t *Tree) Node(id policy.NodeID) *Node { return t.byID.Get(id) }

// info describes n for the evictor at the current logical time.
func (t *Tree) info(n *Node) policy.NodeInfo {
	return policy.NodeInfo{
		ID:         n.id,
		Parent:     n.parent.id,
		Time:       t.clock,
		LastAccess: n.lastAccess,
		Hits:       n.hits,
		Depth:      n.depth,
		Pages:      len(n.hashes),
		Children:   n.Children(),
		Tail:       n.hashes[len(n.hashes)-1],
	}
}

// refresh reports n's evictable state to the evictor if it changed.
func (t *Tree) refresh(n *Node) {
	e := n.IsLeaf() && n.lockRefs == 0 && !n.backupPending && n != t.root
	if e != n.evictable {
		n.evictable = e
		t.ev.SetEvictable(n.id, e)
	}
}

// MatchHashes finds the longest prefix of hs present in the tree, as a
// path of nodes from the root's child down; pages is its length. A match
// that ends inside a node splits that node at the page boundary, so each
// path node is matched whole. It bumps the clock once and records a hit
// (hit count, last access, an evictor Hit) on every path node. The path is
// appended to dst[:0]; reuse dst across calls to avoid allocation.
func (t *Tree) MatchHashes(hs []pagehash.Hash, dst []*Node) (path []*Node, pages int) {
	t.clock++
	path, pages, _ = t.walkHashes(t.root, hs, dst[:0])
	t.hit(path)
	return path, pages
}

// PeekHashes finds the longest prefix of hs present in the tree, like
// MatchHashes, but is not a match: it does not bump the clock and records
// no hit (no hit count, no last access, no evictor Hit), so looking ahead
// at a request does not make its pages look recently used. Like
// MatchHashes it splits the node where the prefix ends inside one, so that
// the path's last node holds exactly the prefix's last page and can be
// locked; the evictor hears that split as it hears any split (Insert of
// the new prefix node, Update of the rest), and both halves keep the
// node's hit count and last access. The path is appended to dst[:0].
func (t *Tree) PeekHashes(hs []pagehash.Hash, dst []*Node) (path []*Node, pages int) {
	t.ops++
	path, pages, _ = t.walkHashes(t.root, hs, dst[:0])
	t.checkSampled()
	return path, pages
}

// MatchTokens is MatchHashes for a key given as tokens: the longest
// page-aligned prefix (a trailing partial page never matches). It hashes
// one page per node boundary it crosses and compares tokens inside nodes.
func (t *Tree) MatchTokens(tokens []uint32, dst []*Node) (path []*Node, pages int) {
	t.clock++
	path, pages, _ = t.walkTokens(tokens, dst[:0])
	t.hit(path)
	return path, pages
}

// hit records a match of path at the current clock (already bumped, so
// that a split made by the walk carries the match's time too).
func (t *Tree) hit(path []*Node) {
	t.ops++
	for _, n := range path {
		n.hits++
		n.lastAccess = t.clock
		t.ev.Hit(t.info(n))
	}
	t.checkSampled()
}

// InsertHashes adds the key hs: the part already present is walked (not
// counted as a hit; Match first for that), splitting a node where the key
// ends or diverges inside it, and the rest becomes one new leaf of
// Options.Residency under the last node walked. It bumps the clock once.
// It returns the node whose last page is the key's last page (the root for
// an empty key) and the number of pages added. The caller frees room
// first (EvictPages): the tree itself has no capacity.
func (t *Tree) InsertHashes(hs []pagehash.Hash) (last *Node, added int) {
	t.clock++
	t.ops++
	last, added = t.extend(t.root, hs, true)
	t.checkSampled()
	return last, added
}

// InsertHashesBorrowed is InsertHashes without the copy: the new leaf
// keeps a sub-slice of hs, so the caller must never modify hs afterwards
// (replay passes its compiled, read-only trace keys). The tree itself
// never appends to or writes into a node's hashes.
func (t *Tree) InsertHashesBorrowed(hs []pagehash.Hash) (last *Node, added int) {
	t.clock++
	t.ops++
	last, added = t.extend(t.root, hs, false)
	t.checkSampled()
	return last, added
}

// Finished reports a finished request to the evictor when it is a
// policy.RequestObserver: last is the node holding the request's last
// cached page (the root or nil when none is cached). It does not bump the
// clock.
func (t *Tree) Finished(last *Node, r policy.RequestInfo) {
	if t.obs == nil {
		return
	}
	r.Leaf = 0
	if last != nil && last != t.root {
		r.Leaf = last.id
	}
	r.Time = t.clock
	t.obs.Finished(r)
}

// ExtendBorrowed inserts hs as the pages that follow n's last page, where
// n is the root or a live node (typically the last node of a Match path):
// it is InsertHashesBorrowed of n's whole key followed by hs, without
// walking down from the root again. It bumps the clock once.
func (t *Tree) ExtendBorrowed(n *Node, hs []pagehash.Hash) (last *Node, added int, err error) {
	return t.extendLive(n, hs, false)
}

// Extend is ExtendBorrowed with a copy: the new leaf keeps its own copy of
// the pages of hs not already present, so the caller may reuse hs.
func (t *Tree) Extend(n *Node, hs []pagehash.Hash) (last *Node, added int, err error) {
	return t.extendLive(n, hs, true)
}

// extendLive is Extend (clone) or ExtendBorrowed: n must be the root or
// live; the clock is bumped once.
func (t *Tree) extendLive(n *Node, hs []pagehash.Hash, clone bool) (last *Node, added int, err error) {
	if n != t.root {
		if err := t.live(n, "extend"); err != nil {
			return nil, 0, err
		}
	}
	t.clock++
	t.ops++
	last, added = t.extend(n, hs, clone)
	t.checkSampled()
	return last, added, nil
}

// extend walks hs down from n and adds the rest as one new leaf.
func (t *Tree) extend(n *Node, hs []pagehash.Hash, clone bool) (last *Node, added int) {
	path, matched, _ := t.walkHashes(n, hs, nil)
	last = n
	if len(path) > 0 {
		last = path[len(path)-1]
	}
	if matched < len(hs) {
		// NB: cap a borrowed slice at its length: a trim then never sees
		// spare capacity that belongs to the caller.
		key := hs[matched:len(hs):len(hs)]
		if clone {
			key = slices.Clone(key)
		}
		last = t.addLeaf(last, key, nil)
		last.borrowed = !clone
		added = len(hs) - matched
	}
	return last, added
}

// InsertTokens is InsertHashes for a key given as tokens; the hashes of
// the new pages are computed here, once, chained after the walked prefix.
// A trailing partial page is not inserted.
func (t *Tree) InsertTokens(tokens []uint32) (last *Node, added int) {
	t.clock++
	t.ops++
	pt := t.opts.PageTokens
	np := len(tokens) / pt
	path, matched, prev := t.walkTokens(tokens, nil)
	last = t.root
	if len(path) > 0 {
		last = path[len(path)-1]
	}
	if matched < np {
		rest := tokens[matched*pt : np*pt]
		hs := pagehash.Chain(make([]pagehash.Hash, 0, np-matched), prev, rest, pt)
		last = t.addLeaf(last, hs, slices.Clone(rest))
		added = np - matched
	}
	t.checkSampled()
	return last, added
}

func (t *Tree) addLeaf(parent *Node, hs []pagehash.Hash, tokens []uint32) *Node {
	n := &Node{
		id:         t.nextID,
		parent:     parent,
		hashes:     hs,
		tokens:     tokens,
		lastAccess: t.clock,
		depth:      parent.depth + len(parent.hashes),
		residency:  t.opts.Residency,
	}
	t.nextID++
	wasLeaf := parent.IsLeaf()
	parent.addChild(n)
	t.addID(n)
	t.addPages(n.residency, len(hs))
	t.ev.Insert(t.info(n))
	if parent != t.root {
		t.ev.Update(t.info(parent))
		if wasLeaf {
			t.refresh(parent)
		}
	}
	t.refresh(n)
	return n
}

func (t *Tree) addPages(r Residency, pages int) {
	t.pages += pages
	for i := range t.opts.Tiers {
		if r&(1<<i) != 0 {
			t.tierPages[i] += pages
		}
	}
}

// walkHashes follows hs down from node, splitting the node where the
// match ends inside it. It appends the path to path.
func (t *Tree) walkHashes(node *Node, hs []pagehash.Hash, path []*Node) ([]*Node, int, pagehash.Hash) {
	i := 0
	for i < len(hs) {
		c := node.child(&hs[i])
		if c == nil {
			break
		}
		n := min(len(c.hashes), len(hs)-i)
		k := 1
		for k < n && c.hashes[k] == hs[i+k] {
			k++
		}
		i += k
		if k < len(c.hashes) {
			c = t.split(c, k)
			path = append(path, c)
			break
		}
		path = append(path, c)
		node = c
	}
	if i == 0 {
		if node == t.root {
			return path, 0, pagehash.Root
		}
		return path, 0, node.hashes[len(node.hashes)-1]
	}
	return path, i, hs[i-1]
}

// walkTokens is walkHashes for tokens. It returns the hash of the last
// matched page (pagehash.Root if none).
func (t *Tree) walkTokens(tokens []uint32, path []*Node) ([]*Node, int, pagehash.Hash) {
	pt := t.opts.PageTokens
	np := len(tokens) / pt
	node, i, prev := t.root, 0, pagehash.Root
	for i < np {
		page := tokens[i*pt : (i+1)*pt]
		h := pagehash.Next(prev, page)
		c := node.child(&h)
		if c == nil || (c.tokens != nil && !slices.Equal(c.tokens[:pt], page)) {
			break
		}
		k := 1
		for k < len(c.hashes) && i+k < np {
			page := tokens[(i+k)*pt : (i+k+1)*pt]
			if c.tokens != nil {
				if !slices.Equal(c.tokens[k*pt:(k+1)*pt], page) {
					break
				}
			} else if pagehash.Next(c.hashes[k-1], page) != c.hashes[k] {
				break
			}
			k++
		}
		i += k
		prev = c.hashes[k-1]
		if k < len(c.hashes) {
			c = t.split(c, k)
			path = append(path, c)
			break
		}
		path = append(path, c)
		node = c
	}
	return path, i, prev
}

// split cuts c after its first k pages (0 < k < pages) and returns the new
// prefix node, which takes c's place under c's parent; c keeps its id and
// becomes the prefix's only child. Both halves keep c's hit count, last
// access, residency and backup-pending marker (a split must never drop the
// marker, or the half without it could be evicted before its backup is
// committed); the prefix carries c's lock refs, since every
// lock through c also runs through it.
func (t *Tree) split(c *Node, k int) *Node {
	if k <= 0 || k >= len(c.hashes) {
		panic(fmt.Sprintf("radix: split of node %d (%d pages) at %d: must leave at least one page on each side", c.id, len(c.hashes), k))
	}
	pt := t.opts.PageTokens
	p := &Node{
		id:            t.nextID,
		parent:        c.parent,
		hits:          c.hits,
		lastAccess:    c.lastAccess,
		depth:         c.depth,
		lockRefs:      c.lockRefs,
		residency:     c.residency,
		backupPending: c.backupPending,
	}
	t.nextID++
	if c.borrowed {
		// The caller's key stays alive anyway: re-slice, no copy.
		p.hashes, p.borrowed = c.hashes[:k:k], true
		c.hashes = c.hashes[k:]
	} else {
		// NB: both halves get their own arrays, so no node ever pins
		// memory of pages it no longer holds.
		p.hashes = slices.Clone(c.hashes[:k])
		c.hashes = slices.Clone(c.hashes[k:])
	}
	if c.tokens != nil {
		p.tokens = slices.Clone(c.tokens[:k*pt])
		c.tokens = slices.Clone(c.tokens[k*pt:])
	}
	c.parent.replaceChild(c, p)
	c.parent = p
	c.depth += k
	p.kids = append(make([]*Node, 0, 1), c)
	t.addID(p)
	t.ev.Insert(t.info(p))
	t.ev.Update(t.info(c))
	return p
}

// ResidentPages returns how many leading pages of path (a Match path) tier
// (1-based) holds: the pages of the path's nodes up to the first node the
// tier does not hold. A host loads back or reloads the rest.
func ResidentPages(path []*Node, tier int) int {
	pages := 0
	for _, n := range path {
		if !n.residency.Has(tier) {
			break
		}
		pages += len(n.hashes)
	}
	return pages
}

// checkSampled runs Check after a mutating call when invariant checks are
// built in, and panics on a violation: a broken invariant is a bug, and
// failing loud with the state is the point of the invariants build. On a
// large tree it checks every (nodes/32+1)th call, about 32 node visits per
// call amortised, so a test replaying a whole trace stays fast; small
// trees are checked every call.
func (t *Tree) checkSampled() {
	if !invariants.Enabled {
		return
	}
	every := uint64(t.byID.Len()/32 + 1)
	if t.ops%every != 0 {
		return
	}
	if err := t.Check(); err != nil {
		panic(fmt.Sprintf("%v (after call %d, clock %d, %d nodes, %d pages)", err, t.ops, t.clock, t.byID.Len(), t.pages))
	}
}

// addID records n in the id table; n's id is the highest so far (nextID),
// so a refusal is a broken invariant.
func (t *Tree) addID(n *Node) {
	if !t.byID.Add(n.id, n) {
		panic(fmt.Sprintf("radix: node id %d not above the ids before it", n.id))
	}
}

package placement

// freeList is the set of free page ranges of one payload kind: a treap keyed
// by first page, each node augmented with the largest range in its subtree,
// so first fit (the lowest-addressed range of at least n pages) and the
// neighbour lookups of coalescing are O(log n).
//
// Nodes live in a slice and refer to each other by index, so the structure
// costs no allocation per operation once warm. Priorities come from a
// counter hashed with splitmix64: the shape depends only on the history of
// operations, never on a random source, and the canonical state (the
// in-order list of ranges) does not depend on the shape at all.
type freeList struct {
	nodes []freeNode
	spare []int32
	root  int32
	count int
	pages int64
	seq   uint64
	// bounds are the first pages of the kind's regions after the first: a
	// range never crosses one, so two ranges meeting there never coalesce.
	bounds []int64
	// path and stack are scratch for the tree walks: path holds the
	// ancestors of a node being changed, stack the nodes a split or merge
	// relinks.
	path, stack []int32
}

type freeNode struct {
	start, pages int64
	maxPages     int64
	prio         uint64
	left, right  int32
}

const nilNode int32 = -1

func newFreeList(bounds []int64) *freeList {
	return &freeList{root: nilNode, bounds: bounds}
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func (f *freeList) isBound(p int64) bool {
	for _, b := range f.bounds {
		if b == p {
			return true
		}
	}
	return false
}

func (f *freeList) reset() {
	f.nodes = f.nodes[:0]
	f.spare = f.spare[:0]
	f.root = nilNode
	f.count = 0
	f.pages = 0
	f.seq = 0
}

func (f *freeList) newNode(start, pages int64) int32 {
	f.seq++
	n := freeNode{start: start, pages: pages, maxPages: pages, prio: splitmix64(f.seq), left: nilNode, right: nilNode}
	if k := len(f.spare); k > 0 {
		i := f.spare[k-1]
		f.spare = f.spare[:k-1]
		f.nodes[i] = n
		return i
	}
	f.nodes = append(f.nodes, n)
	return int32(len(f.nodes) - 1)
}

func (f *freeList) fix(i int32) {
	n := &f.nodes[i]
	m := n.pages
	if n.left != nilNode && f.nodes[n.left].maxPages > m {
		m = f.nodes[n.left].maxPages
	}
	if n.right != nilNode && f.nodes[n.right].maxPages > m {
		m = f.nodes[n.right].maxPages
	}
	n.maxPages = m
}

// NB: the treap operations below are iterative: they walk down once,
// relinking as they go, and then recompute the subtree maxima of the nodes
// they touched bottom up, stopping where a maximum did not change. The
// recursive versions paid a call and a refix per level, also for nodes
// whose maxima could not have changed. A treap's shape is fixed by
// its keys and (distinct) priorities, so the shape, like the ranges, is
// exactly what the recursive versions built.

// fixUp recomputes the maxima of path's nodes, deepest (last) first, each
// the parent of the next deeper one, after the subtree below the last one
// changed. Once a maximum is unchanged, the ones above it are too.
func (f *freeList) fixUp(path []int32) {
	for i := len(path) - 1; i >= 0; i-- {
		old := f.nodes[path[i]].maxPages
		f.fix(path[i])
		if f.nodes[path[i]].maxPages == old {
			return
		}
	}
}

// fixAll recomputes the maxima of nodes, deepest (last) first: nodes a
// split or merge relinked, whose maxima may change either way.
func (f *freeList) fixAll(nodes []int32) {
	for i := len(nodes) - 1; i >= 0; i-- {
		f.fix(nodes[i])
	}
}

// split returns the subtrees of t with keys < key and >= key.
func (f *freeList) split(t int32, key int64) (l, r int32) {
	// The nodes of t on the way down to key are dealt out in order to the
	// right spine of l (keys below key) and the left spine of r.
	lLink, rLink := &l, &r
	f.stack = f.stack[:0]
	for t != nilNode {
		f.stack = append(f.stack, t)
		n := &f.nodes[t]
		if n.start < key {
			*lLink, lLink = t, &n.right
			t = n.right
		} else {
			*rLink, rLink = t, &n.left
			t = n.left
		}
	}
	*lLink, *rLink = nilNode, nilNode
	f.fixAll(f.stack)
	return l, r
}

// merge joins a and b, every key of a below every key of b.
func (f *freeList) merge(a, b int32) int32 {
	// Zip the right spine of a and the left spine of b by priority.
	var t int32
	link := &t
	f.stack = f.stack[:0]
	for a != nilNode && b != nilNode {
		if f.nodes[a].prio > f.nodes[b].prio {
			f.stack = append(f.stack, a)
			*link, link = a, &f.nodes[a].right
			a = f.nodes[a].right
		} else {
			f.stack = append(f.stack, b)
			*link, link = b, &f.nodes[b].left
			b = f.nodes[b].left
		}
	}
	if a != nilNode {
		*link = a
	} else {
		*link = b
	}
	f.fixAll(f.stack)
	return t
}

// NB: give and take find the node they change with one walk from the
// root that records its path in f.path; the change is then made, and the
// maxima above it fixed, from that path, without a second walk.

// linkTo returns the link that holds f.path[d]: the root, or a child
// link of f.path[d-1].
func (f *freeList) linkTo(d int) *int32 {
	if d == 0 {
		return &f.root
	}
	p := &f.nodes[f.path[d-1]]
	if p.left == f.path[d] {
		return &p.left
	}
	return &p.right
}

// unlinkAt removes f.path[d] from the tree and puts it on the spare list.
func (f *freeList) unlinkAt(d int) {
	t := f.path[d]
	f.spare = append(f.spare, t)
	*f.linkTo(d) = f.merge(f.nodes[t].left, f.nodes[t].right)
	f.fixUp(f.path[:d])
}

// setAt changes f.path[d] to [start, start+pages); the new start must
// keep the key order.
func (f *freeList) setAt(d int, start, pages int64) {
	n := &f.nodes[f.path[d]]
	n.start, n.pages = start, pages
	f.fixUp(f.path[:d+1])
}

// insert links node i, whose start is not in the tree, into the tree.
func (f *freeList) insert(i int32) {
	f.findPath(f.nodes[i].start)
	f.insertOnPath(i)
}

// insertOnPath links node i into the tree; f.path is the walk from the
// root to where i's start would be (findPath's).
func (f *freeList) insertOnPath(i int32) {
	nd := &f.nodes[i]
	// Down the path past the nodes of higher priority, whose subtrees gain
	// i; i takes the place of the subtree below them, split by its key.
	d := 0
	for ; d < len(f.path) && nd.prio <= f.nodes[f.path[d]].prio; d++ {
		n := &f.nodes[f.path[d]]
		n.maxPages = max(n.maxPages, nd.pages)
	}
	var link *int32
	switch {
	case d < len(f.path):
		link = f.linkTo(d)
	case d == 0:
		link = &f.root
	case nd.start < f.nodes[f.path[d-1]].start:
		link = &f.nodes[f.path[d-1]].left
	default:
		link = &f.nodes[f.path[d-1]].right
	}
	nd.left, nd.right = f.split(*link, nd.start)
	f.fix(i)
	*link = i
}

// findPath walks from the root towards key, recording the nodes it passes
// in f.path, root first. It returns the positions in f.path of the node
// with the largest start below key and of the one with the smallest start
// above it (-1 where there is none), and whether the last node of the path
// starts at key. Without one that does, the walk ends where key would be
// inserted, and those two nodes are key's neighbours in address order.
func (f *freeList) findPath(key int64) (pred, succ int, exact bool) {
	pred, succ = -1, -1
	f.path = f.path[:0]
	for t := f.root; t != nilNode; {
		f.path = append(f.path, t)
		n := &f.nodes[t]
		switch {
		case n.start < key:
			pred = len(f.path) - 1
			t = n.right
		case n.start > key:
			succ = len(f.path) - 1
			t = n.left
		default:
			return pred, succ, true
		}
	}
	return pred, succ, false
}

// delete unlinks the node keyed key, which is in the tree, and puts it on
// the spare list.
func (f *freeList) delete(key int64) {
	f.findPath(key)
	f.unlinkAt(len(f.path) - 1)
}

// minPath records in f.path the walk from the root to the lowest-addressed
// node, which it returns; the tree is not empty.
func (f *freeList) minPath() int32 {
	f.path = f.path[:0]
	t := f.root
	for {
		f.path = append(f.path, t)
		if f.nodes[t].left == nilNode {
			return t
		}
		t = f.nodes[t].left
	}
}

// setRange changes the node keyed oldStart to [start, start+pages). The
// caller guarantees the key order is unchanged (the new start stays between
// the neighbours).
func (f *freeList) setRange(oldStart, start, pages int64) {
	f.findPath(oldStart)
	f.setAt(len(f.path)-1, start, pages)
}

// firstFit returns the lowest-addressed node of at least n pages, and
// records in f.path the walk from the root to it.
func (f *freeList) firstFit(n int64) (int32, bool) {
	f.path = f.path[:0]
	t := f.root
	if t == nilNode || f.nodes[t].maxPages < n {
		return nilNode, false
	}
	for {
		f.path = append(f.path, t)
		nd := &f.nodes[t]
		if nd.left != nilNode && f.nodes[nd.left].maxPages >= n {
			t = nd.left
			continue
		}
		if nd.pages >= n {
			return t, true
		}
		t = nd.right
	}
}

// take removes n pages, first fit, appending the ranges it took to dst: one
// range when a free range of n pages exists, else the lowest-addressed free
// ranges in address order. The caller has checked that n pages are free.
func (f *freeList) take(n int64, kind uint8, dst []Range) []Range {
	f.pages -= n
	if t, ok := f.firstFit(n); ok {
		nd := f.nodes[t]
		dst = append(dst, Range{Kind: kind, Start: nd.start, Pages: n})
		if nd.pages == n {
			f.unlinkAt(len(f.path) - 1)
			f.count--
		} else {
			f.setAt(len(f.path)-1, nd.start+n, nd.pages-n)
		}
		return dst
	}
	for n > 0 {
		nd := f.nodes[f.minPath()]
		if nd.pages <= n {
			dst = append(dst, Range{Kind: kind, Start: nd.start, Pages: nd.pages})
			f.unlinkAt(len(f.path) - 1)
			f.count--
			n -= nd.pages
			continue
		}
		dst = append(dst, Range{Kind: kind, Start: nd.start, Pages: n})
		f.setAt(len(f.path)-1, nd.start+n, nd.pages-n)
		n = 0
	}
	return dst
}

// give returns [start, start+pages) to the list, coalescing with free
// neighbours inside the same region. It reports false, changing nothing,
// if the range overlaps a free range (a double free).
func (f *freeList) give(start, pages int64) bool {
	pi, si, exact := f.findPath(start)
	if exact {
		return false
	}
	pred, succ := nilNode, nilNode
	if pi >= 0 {
		pred = f.path[pi]
	}
	if si >= 0 {
		succ = f.path[si]
	}
	end := start + pages
	if pred != nilNode && f.nodes[pred].start+f.nodes[pred].pages > start {
		return false
	}
	if succ != nilNode && f.nodes[succ].start < end {
		return false
	}
	f.pages += pages
	joinLeft := pred != nilNode && f.nodes[pred].start+f.nodes[pred].pages == start && !f.isBound(start)
	joinRight := succ != nilNode && f.nodes[succ].start == end && !f.isBound(end)
	switch {
	case joinLeft && joinRight:
		p, s := f.nodes[pred], f.nodes[succ]
		f.delete(s.start)
		f.count--
		f.setRange(p.start, p.start, p.pages+pages+s.pages)
	case joinLeft:
		f.setAt(pi, f.nodes[pred].start, f.nodes[pred].pages+pages)
	case joinRight:
		f.setAt(si, start, f.nodes[succ].pages+pages)
	default:
		f.insertOnPath(f.newNode(start, pages))
		f.count++
	}
	return true
}

// walk calls fn on every free range in address order until fn returns false.
func (f *freeList) walk(fn func(start, pages int64) bool) {
	// Iterative in-order traversal; the stack is at most the tree height.
	var stack [64]int32
	st := stack[:0]
	t := f.root
	for t != nilNode || len(st) > 0 {
		for t != nilNode {
			st = append(st, t)
			t = f.nodes[t].left
		}
		t = st[len(st)-1]
		st = st[:len(st)-1]
		if !fn(f.nodes[t].start, f.nodes[t].pages) {
			return
		}
		t = f.nodes[t].right
	}
}

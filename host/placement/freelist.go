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

// insert links node i, whose start is not in the tree, into the tree.
func (f *freeList) insert(i int32) {
	nd := &f.nodes[i]
	// Down past the nodes of higher priority, whose subtrees gain i; i
	// takes the place of the subtree below them, split by its key.
	link := &f.root
	for t := *link; t != nilNode && nd.prio <= f.nodes[t].prio; t = *link {
		n := &f.nodes[t]
		n.maxPages = max(n.maxPages, nd.pages)
		if nd.start < n.start {
			link = &n.left
		} else {
			link = &n.right
		}
	}
	nd.left, nd.right = f.split(*link, nd.start)
	f.fix(i)
	*link = i
}

// delete unlinks the node keyed key, which is in the tree, and puts it on
// the spare list.
func (f *freeList) delete(key int64) {
	link := &f.root
	f.path = f.path[:0]
	for {
		t := *link
		n := &f.nodes[t]
		if key == n.start {
			f.spare = append(f.spare, t)
			*link = f.merge(n.left, n.right)
			f.fixUp(f.path)
			return
		}
		f.path = append(f.path, t)
		if key < n.start {
			link = &n.left
		} else {
			link = &n.right
		}
	}
}

// deleteMin unlinks the lowest-addressed node and puts it on the spare
// list.
func (f *freeList) deleteMin() {
	link := &f.root
	f.path = f.path[:0]
	for f.nodes[*link].left != nilNode {
		f.path = append(f.path, *link)
		link = &f.nodes[*link].left
	}
	t := *link
	f.spare = append(f.spare, t)
	*link = f.nodes[t].right
	f.fixUp(f.path)
}

// setRange changes the node keyed oldStart to [start, start+pages). The
// caller guarantees the key order is unchanged (the new start stays between
// the neighbours).
func (f *freeList) setRange(oldStart, start, pages int64) {
	f.path = f.path[:0]
	t := f.root
	for t != nilNode {
		f.path = append(f.path, t)
		n := &f.nodes[t]
		if oldStart == n.start {
			break
		}
		if oldStart < n.start {
			t = n.left
		} else {
			t = n.right
		}
	}
	n := &f.nodes[f.path[len(f.path)-1]]
	n.start, n.pages = start, pages
	f.fix(f.path[len(f.path)-1])
	f.fixUp(f.path[:len(f.path)-1])
}

// firstFit returns the lowest-addressed node of at least n pages.
func (f *freeList) firstFit(n int64) (int32, bool) {
	t := f.root
	if t == nilNode || f.nodes[t].maxPages < n {
		return nilNode, false
	}
	for {
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

// neighbours returns the node with the largest start below key, whether a
// node starts exactly at key, and the node with the smallest start above key
// (nilNode where there is none).
func (f *freeList) neighbours(key int64) (pred int32, exact bool, succ int32) {
	pred, succ = nilNode, nilNode
	t := f.root
	for t != nilNode {
		n := &f.nodes[t]
		switch {
		case n.start < key:
			pred = t
			t = n.right
		case n.start > key:
			succ = t
			t = n.left
		default:
			exact = true
			// The successor is the leftmost node of the right subtree.
			for r := n.right; r != nilNode; r = f.nodes[r].left {
				succ = r
			}
			for l := n.left; l != nilNode; l = f.nodes[l].right {
				pred = l
			}
			return pred, exact, succ
		}
	}
	return pred, exact, succ
}

func (f *freeList) min() int32 {
	t := f.root
	if t == nilNode {
		return nilNode
	}
	for f.nodes[t].left != nilNode {
		t = f.nodes[t].left
	}
	return t
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
			f.delete(nd.start)
			f.count--
		} else {
			f.setRange(nd.start, nd.start+n, nd.pages-n)
		}
		return dst
	}
	for n > 0 {
		nd := f.nodes[f.min()]
		if nd.pages <= n {
			dst = append(dst, Range{Kind: kind, Start: nd.start, Pages: nd.pages})
			f.deleteMin()
			f.count--
			n -= nd.pages
			continue
		}
		dst = append(dst, Range{Kind: kind, Start: nd.start, Pages: n})
		f.setRange(nd.start, nd.start+n, nd.pages-n)
		n = 0
	}
	return dst
}

// give returns [start, start+pages) to the list, coalescing with free
// neighbours inside the same region. It reports false, changing nothing,
// if the range overlaps a free range (a double free).
func (f *freeList) give(start, pages int64) bool {
	pred, exact, succ := f.neighbours(start)
	if exact {
		return false
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
		p := f.nodes[pred]
		f.setRange(p.start, p.start, p.pages+pages)
	case joinRight:
		s := f.nodes[succ]
		f.setRange(s.start, start, s.pages+pages)
	default:
		f.insert(f.newNode(start, pages))
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

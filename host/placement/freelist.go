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
	path   []int32
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

// split returns the subtrees of t with keys < key and >= key.
func (f *freeList) split(t int32, key int64) (int32, int32) {
	if t == nilNode {
		return nilNode, nilNode
	}
	if f.nodes[t].start < key {
		l, r := f.split(f.nodes[t].right, key)
		f.nodes[t].right = l
		f.fix(t)
		return t, r
	}
	l, r := f.split(f.nodes[t].left, key)
	f.nodes[t].left = r
	f.fix(t)
	return l, t
}

// merge joins a and b, every key of a below every key of b.
func (f *freeList) merge(a, b int32) int32 {
	if a == nilNode {
		return b
	}
	if b == nilNode {
		return a
	}
	if f.nodes[a].prio > f.nodes[b].prio {
		f.nodes[a].right = f.merge(f.nodes[a].right, b)
		f.fix(a)
		return a
	}
	f.nodes[b].left = f.merge(a, f.nodes[b].left)
	f.fix(b)
	return b
}

func (f *freeList) insertNode(t, i int32) int32 {
	if t == nilNode {
		return i
	}
	if f.nodes[i].prio > f.nodes[t].prio {
		l, r := f.split(t, f.nodes[i].start)
		f.nodes[i].left, f.nodes[i].right = l, r
		f.fix(i)
		return i
	}
	if f.nodes[i].start < f.nodes[t].start {
		f.nodes[t].left = f.insertNode(f.nodes[t].left, i)
	} else {
		f.nodes[t].right = f.insertNode(f.nodes[t].right, i)
	}
	f.fix(t)
	return t
}

func (f *freeList) deleteKey(t int32, key int64) int32 {
	if t == nilNode {
		return nilNode
	}
	n := &f.nodes[t]
	switch {
	case key < n.start:
		n.left = f.deleteKey(n.left, key)
	case key > n.start:
		n.right = f.deleteKey(n.right, key)
	default:
		m := f.merge(n.left, n.right)
		f.spare = append(f.spare, t)
		return m
	}
	f.fix(t)
	return t
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
	for i := len(f.path) - 1; i >= 0; i-- {
		f.fix(f.path[i])
	}
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
			f.root = f.deleteKey(f.root, nd.start)
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
			f.root = f.deleteKey(f.root, nd.start)
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
		f.root = f.deleteKey(f.root, s.start)
		f.count--
		f.setRange(p.start, p.start, p.pages+pages+s.pages)
	case joinLeft:
		p := f.nodes[pred]
		f.setRange(p.start, p.start, p.pages+pages)
	case joinRight:
		s := f.nodes[succ]
		f.setRange(s.start, start, s.pages+pages)
	default:
		f.root = f.insertNode(f.root, f.newNode(start, pages))
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

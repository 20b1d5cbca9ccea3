package placement

import (
	"slices"
	"sort"
)

// freeList is the set of free page ranges of one payload kind, in address
// order, cut into blocks of at most blockMax ranges. Each block knows its
// largest range, so first fit (the lowest-addressed range of at least n
// pages) looks at the block maxima and then into one block, and finding a
// range's neighbours, for coalescing, is a binary search over the blocks'
// first ranges and then over one block.
//
// NB: this replaced a treap, O(log n) per operation. The free lists the
// host sees hold tens of ranges (the host/decisions L2 of 4000 pages: 10
// to 80), where walking the treap's nodes cost more than moving part of a
// block's kilobyte array does (BenchmarkMachinePattern; the figures are in
// docs/perf.md, "L2"). A block splits in two when full and merges with a
// neighbour when the two fit in half a block, so an operation is
// O(n/blockMax + blockMax). First fit scans every block maximum when no
// range is large enough, which the treap did not: a slab cut into
// hundreds of thousands of one-page holes pays for it. The state, the
// in-order list of ranges, does not depend on how it is stored, so
// neither does any decision.
type freeList struct {
	// blocks hold the ranges in address order; none is empty.
	blocks []freeBlock
	count  int
	pages  int64
	// bounds are the first pages of the kind's regions after the first: a
	// range never crosses one, so two ranges meeting there never coalesce.
	bounds []int64
	// spare holds the arrays of removed blocks, for new blocks.
	spare [][]freeRange
}

// freeBlock is a run of consecutive free ranges.
type freeBlock struct {
	// maxPages is the largest range's pages.
	maxPages int64
	// ranges are in address order, between 1 and blockMax of them.
	ranges []freeRange
}

// freeRange is the free pages [start, start+pages).
type freeRange struct {
	start, pages int64
}

// blockMax is the most ranges a block holds: 64 ranges are 1 KiB.
const blockMax = 64

func newFreeList(bounds []int64) *freeList {
	return &freeList{bounds: bounds}
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
	for i := range f.blocks {
		f.spare = append(f.spare, f.blocks[i].ranges[:0])
	}
	f.blocks = f.blocks[:0]
	f.count = 0
	f.pages = 0
}

// newBlockArray returns an empty array of capacity blockMax.
func (f *freeList) newBlockArray() []freeRange {
	if k := len(f.spare); k > 0 {
		a := f.spare[k-1]
		f.spare = f.spare[:k-1]
		return a
	}
	return make([]freeRange, 0, blockMax)
}

// appendRange adds a range above every free range (Reset's regions).
func (f *freeList) appendRange(start, pages int64) {
	if k := len(f.blocks); k == 0 || len(f.blocks[k-1].ranges) == blockMax {
		f.blocks = append(f.blocks, freeBlock{ranges: f.newBlockArray()})
	}
	b := &f.blocks[len(f.blocks)-1]
	b.ranges = append(b.ranges, freeRange{start, pages})
	b.maxPages = max(b.maxPages, pages)
	f.count++
	f.pages += pages
}

// refreshMax recomputes block bi's maximum.
func (f *freeList) refreshMax(bi int) {
	b := &f.blocks[bi]
	m := int64(0)
	for _, r := range b.ranges {
		m = max(m, r.pages)
	}
	b.maxPages = m
}

// find returns where key is or would be: the block whose first range is
// the last to start at or below key (block 0 if none does), and the
// position in it of the first range starting at or above key (possibly
// the block's length).
func (f *freeList) find(key int64) (bi, i int) {
	// The first block whose first range starts above key, less one.
	bi = max(0, sort.Search(len(f.blocks), func(j int) bool { return f.blocks[j].ranges[0].start > key })-1)
	rs := f.blocks[bi].ranges
	i = sort.Search(len(rs), func(j int) bool { return rs[j].start >= key })
	return bi, i
}

// insertAt inserts r at position i of block bi, splitting a full block.
func (f *freeList) insertAt(bi, i int, r freeRange) {
	if len(f.blocks[bi].ranges) == blockMax {
		// Split the block in halves and insert into the one i falls in.
		half := blockMax / 2
		upper := append(f.newBlockArray(), f.blocks[bi].ranges[half:]...)
		f.blocks[bi].ranges = f.blocks[bi].ranges[:half]
		f.blocks = slices.Insert(f.blocks, bi+1, freeBlock{ranges: upper})
		f.refreshMax(bi)
		f.refreshMax(bi + 1)
		if i > half {
			bi, i = bi+1, i-half
		}
	}
	b := &f.blocks[bi]
	b.ranges = slices.Insert(b.ranges, i, r)
	b.maxPages = max(b.maxPages, r.pages)
	f.count++
}

// deleteAt removes range i of block bi, removing the block if that empties
// it and merging it with a neighbour when the two fit in half a block.
func (f *freeList) deleteAt(bi, i int) {
	b := &f.blocks[bi]
	pages := b.ranges[i].pages
	b.ranges = slices.Delete(b.ranges, i, i+1)
	f.count--
	if len(b.ranges) == 0 {
		f.spare = append(f.spare, b.ranges)
		f.blocks = slices.Delete(f.blocks, bi, bi+1)
		return
	}
	if pages == b.maxPages {
		f.refreshMax(bi)
	}
	// Merge with the next block, or the previous one for the last.
	lo := bi
	if lo == len(f.blocks)-1 {
		lo--
	}
	if lo < 0 || len(f.blocks[lo].ranges)+len(f.blocks[lo+1].ranges) > blockMax/2 {
		return
	}
	a, c := &f.blocks[lo], f.blocks[lo+1]
	a.ranges = append(a.ranges, c.ranges...)
	a.maxPages = max(a.maxPages, c.maxPages)
	f.spare = append(f.spare, c.ranges[:0])
	f.blocks = slices.Delete(f.blocks, lo+1, lo+2)
}

// setAt changes range i of block bi to [start, start+pages); the new start
// must keep the address order.
func (f *freeList) setAt(bi, i int, start, pages int64) {
	b := &f.blocks[bi]
	old := b.ranges[i].pages
	b.ranges[i] = freeRange{start, pages}
	switch {
	case pages >= b.maxPages:
		b.maxPages = pages
	case old == b.maxPages:
		f.refreshMax(bi)
	}
}

// take removes n pages, first fit, appending the ranges it took to dst: one
// range when a free range of n pages exists, else the lowest-addressed free
// ranges in address order. The caller has checked that n pages are free.
func (f *freeList) take(n int64, kind uint8, dst []Range) []Range {
	f.pages -= n
	for bi := range f.blocks {
		if f.blocks[bi].maxPages < n {
			continue
		}
		for i, r := range f.blocks[bi].ranges {
			if r.pages < n {
				continue
			}
			dst = append(dst, Range{Kind: kind, Start: r.start, Pages: n})
			if r.pages == n {
				f.deleteAt(bi, i)
			} else {
				f.setAt(bi, i, r.start+n, r.pages-n)
			}
			return dst
		}
	}
	for n > 0 {
		r := f.blocks[0].ranges[0]
		if r.pages <= n {
			dst = append(dst, Range{Kind: kind, Start: r.start, Pages: r.pages})
			f.deleteAt(0, 0)
			n -= r.pages
			continue
		}
		dst = append(dst, Range{Kind: kind, Start: r.start, Pages: n})
		f.setAt(0, 0, r.start+n, r.pages-n)
		n = 0
	}
	return dst
}

// give returns [start, start+pages) to the list, coalescing with free
// neighbours inside the same region. It reports false, changing nothing,
// if the range overlaps a free range (a double free).
func (f *freeList) give(start, pages int64) bool {
	if len(f.blocks) == 0 {
		f.appendRange(start, pages)
		return true
	}
	bi, i := f.find(start)
	// The neighbours: pred below start, at (bi, i-1), succ at or above it,
	// at (sb, si). pred is never in an earlier block: find's block starts
	// at or below start, so i is 0 there only when its first range starts
	// at start itself (a double free, which succ catches), or when it is
	// the first block and nothing lies below start.
	sb, si := bi, i
	if si == len(f.blocks[bi].ranges) {
		sb, si = bi+1, 0
	}
	var pred, succ *freeRange
	if i > 0 {
		pred = &f.blocks[bi].ranges[i-1]
	}
	if sb < len(f.blocks) {
		succ = &f.blocks[sb].ranges[si]
	}
	end := start + pages
	if succ != nil && succ.start == start {
		return false
	}
	if pred != nil && pred.start+pred.pages > start {
		return false
	}
	if succ != nil && succ.start < end {
		return false
	}
	f.pages += pages
	joinLeft := pred != nil && pred.start+pred.pages == start && !f.isBound(start)
	joinRight := succ != nil && succ.start == end && !f.isBound(end)
	switch {
	case joinLeft && joinRight:
		// Grow pred first: deleting succ may move pred's block.
		f.setAt(bi, i-1, pred.start, pred.pages+pages+succ.pages)
		f.deleteAt(sb, si)
	case joinLeft:
		f.setAt(bi, i-1, pred.start, pred.pages+pages)
	case joinRight:
		f.setAt(sb, si, start, succ.pages+pages)
	default:
		f.insertAt(bi, i, freeRange{start, pages})
	}
	return true
}

// walk calls fn on every free range in address order until fn returns false.
func (f *freeList) walk(fn func(start, pages int64) bool) {
	for _, b := range f.blocks {
		for _, r := range b.ranges {
			if !fn(r.start, r.pages) {
				return
			}
		}
	}
}

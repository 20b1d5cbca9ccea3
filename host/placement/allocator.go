// Package placement is the host's deterministic L2 page allocator: it
// decides where in the shared slab every object (the L2 allocation backing
// one radix node) lives, identically on every rank of a context-parallel
// group.
//
// An Allocator is a pure value. It takes operations (reserve, commit,
// release, split, evict-to-fit, reset) and returns decisions; it never
// reads a clock, a random source, a map's iteration order, the slab's bytes
// or anything rank-local, and it does no I/O. Every rank that applies the
// same operations in the same order holds the same state, which Digest
// hashes so ranks can compare it. Capacity is charged once per object
// (pooled): an allocator knows nothing about ranks, and all ranks of a group
// run replicas of one allocator over one shared slab.
//
// Pages are counted per payload kind. Each kind has its own page space
// (its pages are numbered 0..Pages-1 across the kind's regions, see Layout)
// and its own free list; an object holds the same number of pages in every
// kind it was reserved for. A range of pages never straddles two regions and
// therefore never two slabs.
package placement

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kvtier/kvtier/tiers"
)

// Sentinel errors callers branch on with errors.Is.
var (
	// ErrNoSpace means a reservation does not fit, even after evicting the
	// victims offered. The error is an *ExhaustedError.
	ErrNoSpace = errors.New("no space in slab")
	// ErrExists means an object id is already reserved.
	ErrExists = errors.New("object exists")
	// ErrUnknownObject means an object id is not reserved.
	ErrUnknownObject = errors.New("unknown object")
	// ErrNotCommitted means an operation that needs a committed object
	// (split, eviction) was given one that is only reserved.
	ErrNotCommitted = errors.New("object not committed")
	// ErrInvalid marks a malformed argument: a page count below one, a
	// split point that leaves a side empty, an unknown payload kind.
	ErrInvalid = errors.New("invalid placement argument")
)

// ObjectID names an object; the host uses the radix node id.
type ObjectID uint64

// Kinds is a set of payload kinds, bit k for tiers.PayloadKind(k).
type Kinds uint64

// KindSet returns the set of the given kinds.
func KindSet(kinds ...tiers.PayloadKind) Kinds {
	var s Kinds
	for _, k := range kinds {
		s |= 1 << k
	}
	return s
}

// Has reports whether k is in the set.
func (s Kinds) Has(k tiers.PayloadKind) bool { return k < 64 && s&(1<<k) != 0 }

// String renders the set as "{0,2}".
func (s Kinds) String() string {
	var parts []string
	for k := 0; k < 64; k++ {
		if s&(1<<k) != 0 {
			parts = append(parts, fmt.Sprint(k))
		}
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// Range is a run of pages of one kind, in the kind's page space.
type Range struct {
	// Kind is the payload kind.
	Kind uint8
	// Start is the first page.
	Start int64
	// Pages is the number of pages, at least one.
	Pages int64
}

// ObjectInfo describes one object.
type ObjectInfo struct {
	// ID is the object's id.
	ID ObjectID
	// Pages is the object's length in pages (in every kind it holds).
	Pages int64
	// Kinds is the set of kinds the object holds pages of.
	Kinds Kinds
	// Committed reports whether the object was committed.
	Committed bool
	// Ranges lists the object's ranges, by kind ascending and, within a
	// kind, in the order of the object's pages: the object's page i of
	// kind k is found by walking kind k's ranges.
	Ranges []Range
}

// Stats summarises an allocator's state.
type Stats struct {
	// TotalPages and FreePages are per kind.
	TotalPages, FreePages []int64
	// FreeRanges is the number of free ranges per kind (fragmentation).
	FreeRanges []int
	// Objects and Committed count objects.
	Objects, Committed int
}

// object is one reserved object. Most objects hold one range per kind; up
// to inlineRanges of them live inside the object, the others in spill.
//
// NB: objects are kept by pointer in the allocator's map, reused after
// their release (see newObject) with their spill arrays, so that a warm
// allocator allocates nothing, and so that the last object looked up can
// be remembered (see get). They used to be map values, to spare the cache
// miss of the pointer; on BenchmarkMachinePattern the two cost the same
// with 12,000 live objects (l2=400000), and with the Machine's 250
// (l2=4000) the pointers and the remembered object were faster (figures:
// docs/perf.md, "L2").
type object struct {
	id        ObjectID
	pages     int64
	kinds     Kinds
	committed bool
	// victimOf is the EvictToFit call (Allocator.evictions) that last
	// listed the object as a victim: it finds a victim listed twice.
	victimOf uint64
	n        int // ranges in use: inline[:n] up to inlineRanges, else spill[:n]
	inline   [inlineRanges]Range
	spill    []Range
}

const inlineRanges = 2

// rangeList returns the object's ranges (aliasing o).
func (o *object) rangeList() []Range {
	if o.n <= inlineRanges {
		return o.inline[:o.n]
	}
	return o.spill[:o.n]
}

// setRanges stores a copy of rs.
func (o *object) setRanges(rs []Range) {
	o.n = len(rs)
	if len(rs) <= inlineRanges {
		copy(o.inline[:], rs)
		return
	}
	o.spill = append(o.spill[:0], rs...)
}

// Allocator is the deterministic first-fit page allocator of one slab
// layout. It is not safe for concurrent use: the host applies operations
// from its one replicated event loop.
type Allocator struct {
	layout  Layout
	all     Kinds
	total   []int64
	free    []*freeList
	objects map[ObjectID]*object
	// spareObjects are released objects, kept for reuse by newObject.
	spareObjects []*object
	// last is the object most recently reserved or found by get, or nil.
	last *object
	// evictions counts EvictToFit calls that looked at their victims.
	evictions uint64
	rangeBuf  []Range
	splitBuf  []Range
	committed int
	layoutSum []byte // canonical encoding of the layout, hashed by Digest
	scratch   []ObjectID
	buf       []byte
}

// New returns an allocator with every page of layout free.
func New(layout Layout) (*Allocator, error) {
	if err := layout.Validate(); err != nil {
		return nil, fmt.Errorf("new placement allocator: %w", err)
	}
	a := &Allocator{
		layout:  layout,
		total:   make([]int64, len(layout.Kinds)),
		free:    make([]*freeList, len(layout.Kinds)),
		objects: make(map[ObjectID]*object),
	}
	for k, kl := range layout.Kinds {
		a.all |= 1 << k
		var bounds []int64
		var first int64
		for i, r := range kl.Regions {
			if i > 0 {
				bounds = append(bounds, first)
			}
			first += r.Pages
		}
		a.total[k] = first
		a.free[k] = newFreeList(bounds)
	}
	a.layoutSum = encodeLayout(nil, layout)
	a.Reset()
	return a, nil
}

// Layout returns the layout the allocator places into.
func (a *Allocator) Layout() Layout { return a.layout }

// AllKinds returns the set of every kind of the layout.
func (a *Allocator) AllKinds() Kinds { return a.all }

// Reset frees every page and drops every object, restoring the state (and
// the Digest) of a freshly built allocator. The host calls it on a flush.
func (a *Allocator) Reset() {
	for k, kl := range a.layout.Kinds {
		f := a.free[k]
		f.reset()
		var first int64
		for _, r := range kl.Regions {
			f.appendRange(first, r.Pages)
			first += r.Pages
		}
	}
	clear(a.objects)
	a.last = nil
	a.committed = 0
	a.checkInvariants("reset")
}

func (a *Allocator) checkArgs(op string, id ObjectID, pages int64, kinds Kinds) error {
	if pages < 1 {
		return fmt.Errorf("%s object %d: %d pages, want at least 1: %w", op, id, pages, ErrInvalid)
	}
	if kinds == 0 || kinds&^a.all != 0 {
		return fmt.Errorf("%s object %d: kinds %v, want a non-empty subset of %v: %w", op, id, kinds, a.all, ErrInvalid)
	}
	if a.get(id) != nil {
		return fmt.Errorf("%s object %d: %w", op, id, ErrExists)
	}
	return nil
}

// Reserve places a new object of pages pages in every kind of kinds, first
// fit: in each kind, the lowest-addressed free range that holds all pages,
// or else the lowest-addressed free ranges in address order. It fits if and
// only if every kind has pages free pages; otherwise it changes nothing and
// returns an *ExhaustedError (wrapping ErrNoSpace).
func (a *Allocator) Reserve(id ObjectID, pages int64, kinds Kinds) error {
	if err := a.checkArgs("reserve", id, pages, kinds); err != nil {
		return err
	}
	for k := range a.free {
		if kinds&(1<<k) != 0 && a.free[k].pages < pages {
			return &ExhaustedError{Object: id, Pages: pages, Kind: tiers.PayloadKind(k), Free: a.free[k].pages}
		}
	}
	a.place(id, pages, kinds)
	a.checkInvariants("reserve")
	return nil
}

// place reserves an object the caller has checked fits.
func (a *Allocator) place(id ObjectID, pages int64, kinds Kinds) {
	rs := a.rangeBuf[:0]
	for k := range a.free {
		if kinds&(1<<k) != 0 {
			rs = a.free[k].take(pages, uint8(k), rs)
		}
	}
	a.rangeBuf = rs
	o := a.newObject(id, pages, kinds)
	o.setRanges(rs)
	a.objects[id] = o
	a.last = o
}

// get returns the object id, or nil if there is none.
func (a *Allocator) get(id ObjectID) *object {
	// NB: the Machine reserves an object and at once commits it and asks
	// for its ranges; remembering the last object spares those lookups
	// the map's hashing and probing.
	if o := a.last; o != nil && o.id == id {
		return o
	}
	o := a.objects[id]
	if o != nil {
		a.last = o
	}
	return o
}

// newObject returns a zeroed object, reusing a released one (and its
// spill array) when there is one. The caller adds it to the map.
func (a *Allocator) newObject(id ObjectID, pages int64, kinds Kinds) *object {
	if k := len(a.spareObjects); k > 0 {
		o := a.spareObjects[k-1]
		a.spareObjects = a.spareObjects[:k-1]
		*o = object{id: id, pages: pages, kinds: kinds, spill: o.spill[:0]}
		return o
	}
	return &object{id: id, pages: pages, kinds: kinds}
}

// Commit marks a reserved object committed: its bytes are written on every
// rank (the host calls it at the replicated commit frontier). Committing a
// committed object is a no-op.
func (a *Allocator) Commit(id ObjectID) error {
	o := a.get(id)
	if o == nil {
		return fmt.Errorf("commit object %d: %w", id, ErrUnknownObject)
	}
	if !o.committed {
		o.committed = true
		a.committed++
	}
	a.checkInvariants("commit")
	return nil
}

// Release frees an object's pages, coalescing them with free neighbours in
// the same region, and forgets the object. It serves both the abort of a
// reservation and the eviction of a committed object.
func (a *Allocator) Release(id ObjectID) error {
	o := a.get(id)
	if o == nil {
		return fmt.Errorf("release object %d: %w", id, ErrUnknownObject)
	}
	a.drop(o)
	a.checkInvariants("release")
	return nil
}

func (a *Allocator) drop(o *object) {
	for _, r := range o.rangeList() {
		if !a.free[r.Kind].give(r.Start, r.Pages) {
			// Every page of an object is off the free list; finding one on it
			// means two objects share pages — a broken invariant.
			panic(fmt.Sprintf("placement: release object %d: kind %d pages [%d,%d) overlap the free list (double free)", o.id, r.Kind, r.Start, r.Start+r.Pages))
		}
	}
	if o.committed {
		a.committed--
	}
	delete(a.objects, o.id)
	if a.last == o {
		a.last = nil
	}
	a.spareObjects = append(a.spareObjects, o)
}

// Split divides a committed object at page boundary at: the first at pages
// (in every kind) become the new committed object prefix, and id keeps the
// remaining pages. Both sides must be non-empty. This mirrors a radix split,
// where a new parent node takes the leading pages of an existing node.
func (a *Allocator) Split(id ObjectID, at int64, prefix ObjectID) error {
	o := a.get(id)
	if o == nil {
		return fmt.Errorf("split object %d: %w", id, ErrUnknownObject)
	}
	if !o.committed {
		return fmt.Errorf("split object %d: %w", id, ErrNotCommitted)
	}
	if at <= 0 || at >= o.pages {
		return fmt.Errorf("split object %d at page %d: must leave at least one page on each side of %d pages: %w", id, at, o.pages, ErrInvalid)
	}
	if prefix == id {
		return fmt.Errorf("split object %d: prefix id equals the object's id: %w", id, ErrInvalid)
	}
	if a.objects[prefix] != nil {
		return fmt.Errorf("split object %d: prefix object %d: %w", id, prefix, ErrExists)
	}
	head, rest := a.rangeBuf[:0], a.splitBuf[:0]
	var kind uint8
	var seen int64
	for i, r := range o.rangeList() {
		if i == 0 || r.Kind != kind {
			kind, seen = r.Kind, 0
		}
		switch {
		case seen+r.Pages <= at:
			head = append(head, r)
		case seen >= at:
			rest = append(rest, r)
		default:
			cut := at - seen
			head = append(head, Range{Kind: r.Kind, Start: r.Start, Pages: cut})
			rest = append(rest, Range{Kind: r.Kind, Start: r.Start + cut, Pages: r.Pages - cut})
		}
		seen += r.Pages
	}
	p := a.newObject(prefix, at, o.kinds)
	p.committed = true
	p.setRanges(head)
	o.setRanges(rest)
	a.rangeBuf, a.splitBuf = head, rest
	o.pages -= at
	a.objects[prefix] = p
	a.committed++
	a.checkInvariants("split")
	return nil
}

// Object returns a copy of an object's description.
func (a *Allocator) Object(id ObjectID) (ObjectInfo, error) {
	o := a.get(id)
	if o == nil {
		return ObjectInfo{}, fmt.Errorf("object %d: %w", id, ErrUnknownObject)
	}
	return ObjectInfo{ID: o.id, Pages: o.pages, Kinds: o.kinds, Committed: o.committed, Ranges: append([]Range(nil), o.rangeList()...)}, nil
}

// AppendRanges appends the ranges of an object (Object's Ranges) to dst
// and returns it.
func (a *Allocator) AppendRanges(dst []Range, id ObjectID) ([]Range, error) {
	o := a.get(id)
	if o == nil {
		return dst, fmt.Errorf("object %d: %w", id, ErrUnknownObject)
	}
	return append(dst, o.rangeList()...), nil
}

// Spans appends to dst the slab spans of an object's pages of one kind, in
// the object's page order, and returns it. Each span is one range; none
// straddles two slabs.
func (a *Allocator) Spans(id ObjectID, kind tiers.PayloadKind, dst []tiers.Span) ([]tiers.Span, error) {
	o := a.get(id)
	if o == nil {
		return dst, fmt.Errorf("spans of object %d: %w", id, ErrUnknownObject)
	}
	if !o.kinds.Has(kind) {
		return dst, fmt.Errorf("spans of object %d kind %d: object holds kinds %v: %w", id, kind, o.kinds, ErrInvalid)
	}
	for _, r := range o.rangeList() {
		if r.Kind != uint8(kind) {
			continue
		}
		s, err := a.layout.Span(kind, r)
		if err != nil {
			return dst, fmt.Errorf("spans of object %d: %w", id, err)
		}
		dst = append(dst, s)
	}
	return dst, nil
}

// PageSpans appends to dst one slab span per page of an object's pages of
// one kind, in the object's page order (the spans a Store put or get of
// the object's pages names), and returns it.
func (a *Allocator) PageSpans(id ObjectID, kind tiers.PayloadKind, dst []tiers.Span) ([]tiers.Span, error) {
	n := len(dst)
	dst, err := a.Spans(id, kind, dst)
	if err != nil {
		return dst, err
	}
	// Expand the runs in place, last first: run j's pages land at or
	// after index n+j, so no run is overwritten before it is read.
	pb := a.layout.Kinds[kind].PageBytes
	runs, pages := len(dst)-n, 0
	for _, r := range dst[n:] {
		pages += int(r.Length / pb)
	}
	dst = slices.Grow(dst, pages-runs)[:n+pages]
	at := n + pages
	for j := runs - 1; j >= 0; j-- {
		r := dst[n+j]
		for off := r.Length - pb; off >= 0; off -= pb {
			at--
			dst[at] = tiers.Span{Slab: r.Slab, Offset: r.Offset + off, Length: pb}
		}
	}
	return dst, nil
}

// Has reports whether id is reserved.
func (a *Allocator) Has(id ObjectID) bool { return a.get(id) != nil }

// FreePages returns the number of free pages of kind k.
func (a *Allocator) FreePages(k tiers.PayloadKind) int64 {
	if int(k) >= len(a.free) {
		return 0
	}
	return a.free[k].pages
}

// Stats returns a summary of the state.
func (a *Allocator) Stats() Stats {
	s := Stats{
		TotalPages: append([]int64(nil), a.total...),
		FreePages:  make([]int64, len(a.free)),
		FreeRanges: make([]int, len(a.free)),
		Objects:    len(a.objects),
		Committed:  a.committed,
	}
	for k, f := range a.free {
		s.FreePages[k] = f.pages
		s.FreeRanges[k] = f.count
	}
	return s
}

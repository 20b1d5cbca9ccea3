// Package hindsight is a kvtier eviction policy that learns from what
// happened to earlier nodes: which kinds of insert were reused, and which
// evicted pages came back.
//
// It keeps proven's segmented order (policy/proven) and adds two replicated
// signals:
//
//   - Learned reuse rates. Every new leaf gets a signature (inserted at the
//     root or below a matched prefix, log2 of its page count, and — when
//     the host reports finished requests (policy.RequestObserver) — log2 of
//     the output length of the request that created it). The policy
//     counts, per signature, the leaves inserted and the leaves that were
//     matched at least once while cached, halving both every 4,096 inserts.
//     A new leaf whose signature is reused at less than Params["low_ratio"]
//     (default 0.5) of the overall rate starts in a low-reuse probation
//     class that goes before other never-matched nodes. A signature's rate
//     is smoothed toward the rate of the same signature without the output
//     length, which is smoothed toward the overall rate, so a rare output
//     length is judged by what is known of its kind. What is "low" is
//     learned per workload: on the Mooncake trace it is the continuation of
//     a prefix (reused 1-3% of the time) and the document inserts of
//     requests that generated 128 tokens or more (1-7% against 81-90% for
//     those that generated under 32); on conversational workloads
//     continuations are the next turns and stay normal.
//   - A ghost of evicted pages. The tree frees this policy's victims one
//     page at a time (TailRanked), so every evicted page was a node's tail
//     when it left, and its hash was reported. The policy remembers the
//     last Params["ghost"] (default 1.0) x peak cached pages of them. A
//     never-matched node whose tail is such a ghost — when inserted, or
//     when a trim exposes it — holds content that was cached before and is
//     being fetched again (a re-fetched document): it is protected as if
//     matched.
//
// Order of the evictable leaves, least kept first, each class by (last
// access, node id):
//
//  0. untouched — never matched and not yet trimmed: only the tail page
//     goes from this class (a request's last page is rarely asked for
//     again), then the node moves to probation.
//  1. low-reuse probation — never matched, signature predicted unlikely to
//     be reused.
//  2. probation — the other never-matched nodes, and protected nodes
//     demoted for lack of room.
//  3. protected — matched at least once, or recalled by the ghost; at most
//     Params["protected_share"] (default 0.7) of the cached pages, the
//     oldest demoted past it.
//
// Every input is a replicated event (node id, logical time, hit count,
// depth, pages, children, tail hash), every counter is an integer updated in
// event order, so replicas fed the same events choose the same victims. The
// package must never read a wall clock, a random source, a map iteration
// order or rank-local state.
//
// The order, the protected segment and its demotions are the segmented-LRU
// core shared with slru and proven (policy/internal/segmented); the ghost
// is the ghost table shared with adaptive (policy/internal/ghost).
//
// Memory: per live node one table entry, 40 bytes of state and up to two
// 36-byte heap entries (victim heap while an evictable leaf, protected heap
// while protected); a fixed table of counters for 512 signatures and their
// 32 output-blind parents (8.5 KiB); and the ghost, ghost x peak cached
// pages remembered pages in a ring of 8-byte keys (rounded up to a power of
// two) and an open-addressed table of twice the ring's length in 13-byte
// slots: at most 68 bytes per remembered page.
package hindsight

import (
	"fmt"
	"math/bits"

	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/internal/ghost"
	"github.com/kvtier/kvtier/policy/internal/segmented"
)

// Name is the registered name of the policy.
const Name = "hindsight"

// Defaults of the parameters.
const (
	// DefaultProtectedShare is the default largest share of cached pages
	// held by protected nodes.
	DefaultProtectedShare = 0.7
	// DefaultGhost is the default ghost size, in multiples of the peak
	// number of cached pages.
	DefaultGhost = 1.0
	// DefaultLowRatio is the default fraction of the overall reuse rate
	// under which a signature is predicted low-reuse.
	DefaultLowRatio = 0.5
)

// MaxGhost is the largest accepted ghost multiple.
const MaxGhost = 8

// Classes of the victim order; lower is evicted first.
const (
	classUntouched = 0
	classLow       = 1
	classProbation = 2
	classProtected = 3
)

const (
	// halveEvery is the number of inserts after which the reuse counts
	// are halved, so the rates follow a changing workload.
	halveEvery = 4096
	// prior is the weight, in inserts, of the overall rate mixed into a
	// signature's rate, so a rare signature is not judged on a handful
	// of leaves.
	prior = 4
	// sigPagesBuckets is the number of page-count buckets (log2) of a
	// signature.
	sigPagesBuckets = 16
	// baseSigs is the number of output-blind signatures: (inserted at the
	// root or not) x page-count bucket.
	baseSigs = 2 * sigPagesBuckets
	// outBuckets is the number of output-length buckets of a signature:
	// 0 = not reported, then 1 + log2 of the output tokens, capped.
	outBuckets = 16
	// sigs is the number of signatures.
	sigs = baseSigs * outBuckets
	// lowRatioScale is the fixed-point scale of low_ratio.
	lowRatioScale = 1024
)

// Register adds hindsight to r.
func Register(r *policy.Registry) error {
	return r.Register(policy.Registration{
		Type:    policy.EvictorV1,
		Name:    Name,
		Doc:     "proven's segmented order plus learned reuse rates per insert signature and a ghost of evicted pages",
		Factory: func(opts policy.Options) (policy.Evictor, error) { return New(opts) },
	})
}

// node is hindsight's own state of a node; pages, last access and
// protection are the core's.
type node struct {
	depth     int
	tail      uint64
	sig       uint16
	untouched bool
	everHit   bool
	low       bool
}

// class is the victim class of an unprotected node.
func class(v *node) uint64 {
	switch {
	case v.untouched:
		return classUntouched
	case v.low:
		return classLow
	}
	return classProbation
}

// Hindsight is the hindsight Evictor. Use New.
type Hindsight struct {
	ghostX   float64
	lowRatio uint64 // low_ratio x lowRatioScale

	core *segmented.LRU[node]
	peak int64 // the most pages cached at once

	// Reuse counts per signature, per output-blind signature, and
	// overall.
	inserted   [sigs]uint64
	reused     [sigs]uint64
	baseIns    [baseSigs]uint64
	baseReused [baseSigs]uint64
	allIns     uint64
	allReuse   uint64
	sinceHalve int

	// split is the slot and id of the node just inserted by a split (an
	// Insert that already has a child), whose suffix's Update follows.
	splitID   policy.NodeID
	splitSlot int32

	ghost ghost.Table // evicted tails, all with tag 0

	// deadAtHit, set only by this package's oracle experiments (nil in
	// every policy New returns), tells Hit that the matched node will not
	// be used again: Hit then withholds protection, and with deadToLow
	// sends the node to the low class.
	deadAtHit func(n policy.NodeInfo) bool
	deadToLow bool
}

// New returns an empty Hindsight. It accepts Params["protected_share"] in
// [0, 1], Params["ghost"] in [0, MaxGhost] (0 turns the ghost off) and
// Params["low_ratio"] in [0, 1] (0 turns the low-reuse class off).
func New(opts policy.Options) (*Hindsight, error) {
	if err := policy.CheckParams(Name, opts.Params, "protected_share", "ghost", "low_ratio"); err != nil {
		return nil, fmt.Errorf("new hindsight: %w", err)
	}
	h := &Hindsight{ghostX: DefaultGhost}
	share, lowRatio := DefaultProtectedShare, DefaultLowRatio
	for _, p := range []struct {
		name string
		max  float64
		dst  *float64
	}{
		{"protected_share", 1, &share},
		{"ghost", MaxGhost, &h.ghostX},
		{"low_ratio", 1, &lowRatio},
	} {
		v, err := policy.RangeParam(opts.Params, p.name, *p.dst, p.max)
		if err != nil {
			return nil, fmt.Errorf("new hindsight: %w", err)
		}
		*p.dst = v
	}
	h.lowRatio = uint64(lowRatio*lowRatioScale + 0.5)
	h.core = segmented.New(share, classProtected, class)
	return h, nil
}

// Name returns "hindsight".
func (h *Hindsight) Name() string { return Name }

// TailRanked asks the radix tree to free this policy's victims one page at
// a time (radix.TailRanker): a trim moves an untouched leaf to probation,
// and every freed page's hash reaches the ghost as a reported tail.
func (h *Hindsight) TailRanked() bool { return true }

// signature classes a new leaf before its request is reported: inserted at
// the root or not, and the log2 bucket of its page count; output bucket 0.
func signature(n *policy.NodeInfo) uint16 {
	s := min(bits.Len(uint(max(n.Pages, 0))), sigPagesBuckets-1)
	if n.Depth == 0 {
		s += sigPagesBuckets
	}
	return uint16(s)
}

// withOutput returns output-blind signature base with the output bucket of
// a request that generated out tokens.
func withOutput(base uint16, out int) uint16 {
	b := 1 + min(bits.Len(uint(max(out, 0))), outBuckets-2)
	return base + uint16(baseSigs*b)
}

// predictLow reports whether signature s is reused at less than low_ratio
// of the overall rate. The output-blind signature's rate is smoothed with
// prior inserts at the overall rate; a signature with an output bucket is
// smoothed with prior inserts at that rate. All in integers, so every
// replica agrees.
func (h *Hindsight) predictLow(s uint16) bool {
	if h.lowRatio == 0 {
		return false
	}
	b := s % baseSigs
	gi, gr := h.allIns+1, h.allReuse+1
	bi, br := h.baseIns[b], h.baseReused[b]
	if s < baseSigs {
		// (br + prior*gr/gi) / (bi + prior) < ratio * gr/gi,
		// multiplied through by gi*(bi+prior)*scale.
		return (br*gi+prior*gr)*lowRatioScale < h.lowRatio*gr*(bi+prior)
	}
	// With rb = (br*gi + prior*gr) / (gi*(bi+prior)) the parent's rate:
	// (reused + prior*rb) / (inserted + prior) < ratio * gr/gi,
	// multiplied through by gi*(bi+prior)*(inserted+prior)*scale.
	// NB: halving keeps every count below 2*halveEvery, so the products
	// stay far below 2^64.
	lhs := (h.reused[s]*gi*(bi+prior) + prior*(br*gi+prior*gr)) * lowRatioScale
	rhs := h.lowRatio * gr * (bi + prior) * (h.inserted[s] + prior)
	return lhs < rhs
}

// learnInsert counts a new leaf of signature s.
func (h *Hindsight) learnInsert(s uint16) {
	h.inserted[s]++
	h.baseIns[s%baseSigs]++
	h.allIns++
	h.sinceHalve++
	if h.sinceHalve >= halveEvery {
		h.sinceHalve = 0
		for i := range h.inserted {
			h.inserted[i] /= 2
			h.reused[i] /= 2
		}
		for i := range h.baseIns {
			h.baseIns[i] /= 2
			h.baseReused[i] /= 2
		}
		h.allIns /= 2
		h.allReuse /= 2
	}
}

// learnReuse counts the first match of a leaf of signature s.
func (h *Hindsight) learnReuse(s uint16) {
	h.reused[s]++
	h.baseReused[s%baseSigs]++
	h.allReuse++
}

// Insert records a new node. A new leaf is classed by its signature and
// the ghost; a node split off a matched one carries its hit count and
// starts protected.
func (h *Hindsight) Insert(n policy.NodeInfo) {
	slot, fresh := h.core.Add(n.ID)
	if !fresh {
		h.Update(n)
		return
	}
	v := h.core.At(slot)
	v.untouched = n.Hits == 0
	v.everHit = n.Hits > 0
	v.depth = n.Depth
	v.tail = ghost.Key(&n.Tail)
	protect := n.Hits >= 1
	if n.Children > 0 {
		// A split: the suffix's Update follows and hands over its
		// signature and history.
		h.splitID, h.splitSlot = n.ID, slot
	} else if n.Hits == 0 {
		v.sig = signature(&n)
		v.low = h.predictLow(v.sig)
		h.learnInsert(v.sig)
		protect = h.ghost.Has(v.tail)
	}
	h.apply(slot, n, n.LastAccess, protect)
}

// Hit refreshes n and protects it. The first hit of a node counts as a
// reuse of its signature.
func (h *Hindsight) Hit(n policy.NodeInfo) {
	slot, _ := h.core.Add(n.ID)
	v := h.core.At(slot)
	if !v.everHit {
		v.everHit = true
		h.learnReuse(v.sig)
	}
	v.untouched = false
	v.low = false
	v.depth = n.Depth
	if h.deadAtHit != nil && h.deadAtHit(n) {
		h.hitDead(slot, n)
		return
	}
	h.apply(slot, n, max(n.LastAccess, n.Time), true)
}

// hitDead is Hit for a node an oracle experiment knows is dead.
func (h *Hindsight) hitDead(slot int32, n policy.NodeInfo) {
	h.core.Unprotect(slot)
	h.core.At(slot).low = h.deadToLow
	h.apply(slot, n, max(n.LastAccess, n.Time), false)
}

// Update takes n's new pages, depth and last access. A node that lost
// pages at an unchanged depth was trimmed: its old tail goes to the ghost,
// and a never-matched node whose new tail is a ghost is protected. The
// suffix of a split hands its signature and history to the new prefix.
func (h *Hindsight) Update(n policy.NodeInfo) {
	slot, fresh := h.core.Add(n.ID)
	v := h.core.At(slot)
	protect := false
	switch {
	case fresh:
		v.untouched = n.Hits == 0
		v.everHit = n.Hits > 0
		protect = n.Hits >= 1
	case n.Depth == v.depth && int64(n.Pages) < h.core.Pages(slot):
		v.untouched = false
		h.ghost.Add(v.tail, 0, h.ghostLimit())
		protect = !v.everHit && h.ghost.Has(ghost.Key(&n.Tail))
	case n.Depth > v.depth && n.Parent == h.splitID && h.splitID != 0:
		if p, ok := h.core.Lookup(h.splitID); ok && p == h.splitSlot {
			// NB: the prefix has a child, so it is no evictable leaf
			// and its victim key is computed when it becomes one.
			pv := h.core.At(p)
			pv.sig, pv.everHit, pv.low = v.sig, v.everHit, v.low && !h.core.Protected(p)
		}
		h.splitID = 0
	}
	v.tail = ghost.Key(&n.Tail)
	v.depth = n.Depth
	h.apply(slot, n, n.LastAccess, protect)
}

// ghostLimit is the number of evicted pages the ghost remembers now.
func (h *Hindsight) ghostLimit() int {
	return int(h.ghostX * float64(h.peak))
}

// apply hands n's pages and last access at to the core, protecting it
// when protect is set, and follows the peak of cached pages. A node that
// becomes protected leaves the low-reuse class.
func (h *Hindsight) apply(slot int32, n policy.NodeInfo, at uint64, protect bool) {
	if protect && !h.core.Protected(slot) {
		h.core.At(slot).low = false
	}
	h.core.Apply(slot, n.ID, n.Pages, at, protect)
	// NB: the core's demotions do not change the cached pages, so the
	// peak after them is the peak after the resize.
	h.peak = max(h.peak, h.core.CachedPages())
}

// Finished moves the leaf a finished request created (still never matched,
// created at the request's insert, output bucket not yet set) to the
// signature with the request's output bucket, and re-predicts its class.
// Other reports are ignored: a request that created nothing, or whose leaf
// was already matched, split or trimmed, teaches nothing new.
func (h *Hindsight) Finished(r policy.RequestInfo) {
	slot, ok := h.core.Lookup(r.Leaf)
	if !ok {
		return
	}
	v := h.core.At(slot)
	if v.everHit || !v.untouched || v.sig >= baseSigs || h.core.LastAccess(slot) != r.Time {
		return
	}
	old := v.sig
	v.sig = withOutput(old, r.OutputTokens)
	// NB: the base count is unchanged (same output-blind signature); a
	// halving between the insert and this report may have taken the old
	// count to zero already.
	if h.inserted[old] > 0 {
		h.inserted[old]--
	}
	h.inserted[v.sig]++
	v.low = !h.core.Protected(slot) && h.predictLow(v.sig)
	h.core.Rekey(slot, r.Leaf)
}

// Remove forgets id; its last tail goes to the ghost.
func (h *Hindsight) Remove(id policy.NodeID) {
	slot, ok := h.core.Lookup(id)
	if !ok {
		return
	}
	h.ghost.Add(h.core.At(slot).tail, 0, h.ghostLimit())
	h.core.Remove(id)
	if id == h.splitID {
		h.splitID = 0
	}
}

// SetEvictable adds id to or removes it from the candidates. Unknown ids
// are ignored.
func (h *Hindsight) SetEvictable(id policy.NodeID, evictable bool) {
	h.core.SetEvictable(id, evictable)
}

// Victim returns the least evictable leaf in (class, last access, id).
func (h *Hindsight) Victim() (policy.NodeID, bool) { return h.core.Victim() }

// Class returns id's current class (0 untouched, 1 low-reuse probation,
// 2 probation, 3 protected) and whether id is known; for tests and
// inspection.
func (h *Hindsight) Class(id policy.NodeID) (int, bool) { return h.core.Class(id) }

// Check verifies the internal invariants; "" when they hold.
func (h *Hindsight) Check() string {
	if msg := h.core.Check(); msg != "" {
		return msg
	}
	return h.ghost.Check()
}

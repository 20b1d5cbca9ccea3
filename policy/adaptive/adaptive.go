// Package adaptive is kvtier's default eviction policy: it follows one of
// two experts, lru and hindsight, and switches to whichever is winning on
// the traffic and capacity it sees, so it is never much worse than lru and
// gains hindsight's hits where capacity binds.
//
// Both experts see every event of the tree and keep their full order; the
// tree evicts the victim of the expert being followed. Whenever the two
// would evict differently, the decision is a duel with a known outcome
// later:
//
//   - the followed expert evicted page X (the tail page of its victim)
//     that the other expert would have kept: X goes to a bounded ghost,
//     tagged with the expert that evicted it. If a later request asks for
//     X and misses it, the followed expert lost a page hit the other would
//     have had.
//   - the other expert would have evicted the tail page of its own victim
//     Y, which the followed expert kept: Y owes one page to the follower.
//     If a later match reaches Y whole, the followed expert won the page
//     hits Y owes.
//
// The score is the decayed sum of these outcomes, in pages, counted as
// hindsight's advantage over lru (a duel lost by the followed expert
// counts for the other). The policy follows hindsight while the score is
// above -Params["margin"] pages and lru while it is below +margin, with
// hysteresis: it switches only when the score crosses the margin on the
// other side. The score decays by 1/2^Params["decay_shift"] (default 9)
// per logical tick (a request is two ticks), so its memory is about a
// thousand requests and it follows a change of traffic.
//
// Requests whose misses are reported (policy.RequestObserver with
// RequestInfo.Pages) find their missed pages in the ghost; without page
// reports the ghost is only searched with inserted and exposed tails, as
// hindsight's own ghost is.
//
// Every input is a replicated event (node id, logical time, depth, pages,
// tail hash, request reports); the experts are deterministic; the score is
// an integer updated in event order; ties between the experts' victims do
// not arise (each names one node, and the followed one is evicted). The
// package must never read a wall clock, a random source, a map iteration
// order or rank-local state.
//
// Memory: per live node hindsight's state (a table entry, 40 bytes and up
// to two 36-byte heap entries) and this package's table entry, 40 bytes
// (tail key, last access, pages, depth, pages owed, flags) and lru's
// 36-byte heap entry while evictable; so per cached page at most two table
// entries and 184 bytes. Ghosts, both bounded by the peak number of cached
// pages: hindsight's and the duel ghost, one ghost table each
// (policy/internal/ghost: at most 68 bytes per remembered page). The list
// of indebted nodes is compacted to at most twice their number.
package adaptive

import (
	"fmt"

	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/hindsight"
	"github.com/kvtier/kvtier/policy/internal/ghost"
	"github.com/kvtier/kvtier/policy/internal/leafheap"
	"github.com/kvtier/kvtier/policy/lru"
)

// Name is the registered name of the policy.
const Name = "adaptive"

// DefaultMargin is the default hysteresis of a switch, in pages of
// decayed score.
const DefaultMargin = 8

// MaxMargin is the largest accepted margin.
const MaxMargin = 1 << 20

const (
	// scale is the fixed-point scale of the score.
	scale = 1 << 8
	// DefaultDecayShift: every tick the score loses score >> decay_shift.
	DefaultDecayShift = 9
	// maxDecaySteps bounds the decay work of one event after a long
	// quiet stretch (the score is zero long before).
	maxDecaySteps = 1 << 16
)

// Experts, also the tags of the duel ghost: which expert's decision
// evicted a page.
const (
	followHindsight uint8 = iota
	followLRU
)

// Register adds adaptive to r.
func Register(r *policy.Registry) error {
	return r.Register(policy.Registration{
		Type:    policy.EvictorV1,
		Name:    Name,
		Doc:     "follows lru or hindsight, whichever wins the duels over their differing victims on the current traffic",
		Factory: func(opts policy.Options) (policy.Evictor, error) { return New(opts) },
	})
}

type node struct {
	tail       uint64
	lastAccess uint64 // lru's key
	pages      int32
	depth      int32
	// owed counts the tail pages the other expert would have evicted
	// while the followed one kept them; a node whose pages are all owed
	// is hidden from the other expert, whose next victims then continue
	// its eviction sequence.
	owed      int32
	hidden    bool
	evictable bool
	listed    bool
}

// Adaptive is the adaptive Evictor. Use New.
type Adaptive struct {
	hs *hindsight.Hindsight
	// lru is the lru expert's heap of evictable leaves by (last access,
	// id) over this package's slots: the same order as policy/lru,
	// without a second node table.
	lru        leafheap.Heap
	follow     uint8
	margin     int64 // in score units (pages x scale)
	decayShift uint
	score      int64 // hindsight's advantage over lru, pages x scale
	decayAt    uint64

	nodes *leafheap.Table[node]
	pages int64
	peak  int64
	ghost ghost.Table // the duel ghost, tagged by the expert that evicted
	// debtors lists the nodes that owe pages (and perhaps some that no
	// longer do or are gone), so a switch can clear them.
	debtors []policy.NodeID
	owing   int

	// The last Victim call's pair: the followed expert's victim and the
	// other's; an eviction of chosen commits the duel.
	chosen, other policy.NodeID

	switches int
}

// New returns an empty Adaptive. It accepts Params["margin"] in [0,
// MaxMargin] pages (default DefaultMargin) and Params["decay_shift"], a
// whole number in [1, 20] (default DefaultDecayShift).
func New(opts policy.Options) (*Adaptive, error) {
	if err := policy.CheckParams(Name, opts.Params, "margin", "decay_shift"); err != nil {
		return nil, fmt.Errorf("new adaptive: %w", err)
	}
	margin, err := policy.RangeParam(opts.Params, "margin", DefaultMargin, MaxMargin)
	if err != nil {
		return nil, fmt.Errorf("new adaptive: %w", err)
	}
	h, err := hindsight.New(policy.Options{})
	if err != nil {
		return nil, fmt.Errorf("new adaptive: %w", err)
	}
	shift, err := policy.RangeParam(opts.Params, "decay_shift", DefaultDecayShift, 20)
	if err != nil || shift < 1 || shift != float64(int(shift)) {
		return nil, fmt.Errorf("new adaptive: decay_shift %v: want a whole number in [1, 20] (%v)", opts.Params["decay_shift"], err)
	}
	return &Adaptive{hs: h, nodes: leafheap.NewTable[node](), margin: int64(margin*scale + 0.5), decayShift: uint(shift)}, nil
}

// Name returns "adaptive".
func (a *Adaptive) Name() string { return Name }

// TailRanked asks the tree to free victims one page at a time: hindsight
// needs it, and each freed page is one duel.
func (a *Adaptive) TailRanked() bool { return true }

// Following returns the name of the expert followed now; for tests and
// inspection.
func (a *Adaptive) Following() string {
	if a.follow == followLRU {
		return lru.Name
	}
	return hindsight.Name
}

// show adds (evictable true) or removes slot as a candidate of expert e.
func (a *Adaptive) show(e uint8, slot int32, id policy.NodeID, evictable bool) {
	switch {
	case e == followHindsight:
		a.hs.SetEvictable(id, evictable)
	case evictable:
		a.lru.Set(slot, id, leafheap.Key{A: a.nodes.At(slot).lastAccess})
	default:
		a.lru.Remove(slot)
	}
}

// victim returns expert e's victim.
func (a *Adaptive) victim(e uint8) (policy.NodeID, bool) {
	if e == followHindsight {
		return a.hs.Victim()
	}
	_, id, _, ok := a.lru.Min()
	return id, ok
}

// touch sets the lru key of slot to at.
func (a *Adaptive) touch(slot int32, id policy.NodeID, at uint64) {
	a.nodes.At(slot).lastAccess = at
	if a.lru.Contains(slot) {
		a.lru.Set(slot, id, leafheap.Key{A: at})
	}
}

// Score returns hindsight's decayed advantage over lru in pages and the
// number of switches so far; for tests and inspection.
func (a *Adaptive) Score() (pages float64, switches int) {
	return float64(a.score) / scale, a.switches
}

// tick decays the score up to logical time now.
func (a *Adaptive) tick(now uint64) {
	if now <= a.decayAt {
		return
	}
	steps := min(now-a.decayAt, maxDecaySteps)
	a.decayAt = now
	for range steps {
		if a.score == 0 {
			return
		}
		a.score -= a.score >> a.decayShift
		if a.score < 0 && a.score > -(1<<a.decayShift) {
			// NB: an arithmetic shift of a small negative score is -1
			// forever; let it reach zero like a positive one.
			a.score++
		}
	}
}

// credit adds pages won by expert e over the other to the score and
// switches when the score crosses the margin.
func (a *Adaptive) credit(e uint8, pages int64) {
	if e == followHindsight {
		a.score += pages * scale
	} else {
		a.score -= pages * scale
	}
	if (a.follow == followHindsight && a.score < -a.margin) || (a.follow == followLRU && a.score > a.margin) {
		a.switchExpert()
	}
}

// switchExpert follows the other expert: every node hidden from it is
// shown again and every debt is cleared, since from now on the cache the
// duels compare against is the new follower's.
func (a *Adaptive) switchExpert() {
	for _, id := range a.debtors {
		s, ok := a.nodes.Lookup(id)
		if !ok {
			continue
		}
		v := a.nodes.At(s)
		if v.hidden && v.evictable {
			a.show(1-a.follow, s, id, true)
		}
		v.hidden, v.owed, v.listed = false, 0, false
	}
	a.debtors = a.debtors[:0]
	a.owing = 0
	a.follow = 1 - a.follow
	a.chosen = 0
	a.switches++
}

func (a *Adaptive) recall(k uint64) {
	if tag, ok := a.ghost.Take(k); ok {
		// The expert that evicted k lost it: a win for the other.
		a.credit(1-tag, 1)
	}
}

// Insert reports a new node to both experts. A new leaf whose tail is in
// the duel ghost is a recall.
func (a *Adaptive) Insert(n policy.NodeInfo) {
	a.chosen = 0
	a.tick(n.Time)
	a.hs.Insert(n)
	slot, fresh := a.nodes.Add(n.ID)
	v := a.nodes.At(slot)
	a.resize(v, n)
	a.touch(slot, n.ID, n.LastAccess)
	v.tail = ghost.Key(&n.Tail)
	if fresh && n.Hits == 0 && n.Children == 0 {
		a.recall(v.tail)
	}
}

// Hit reports a match to both experts; a node matched whole pays the
// pages it owes to the followed expert.
func (a *Adaptive) Hit(n policy.NodeInfo) {
	a.chosen = 0
	a.tick(n.Time)
	a.hs.Hit(n)
	slot, _ := a.nodes.Add(n.ID)
	v := a.nodes.At(slot)
	a.resize(v, n)
	a.touch(slot, n.ID, max(n.LastAccess, n.Time))
	if v.owed > 0 {
		o := v.owed
		a.settle(slot, n.ID, v)
		a.credit(a.follow, int64(min(o, max(int32(n.Pages), 1))))
	}
}

// settle clears v's debt and shows it to the other expert again.
func (a *Adaptive) settle(slot int32, id policy.NodeID, v *node) {
	if v.hidden && v.evictable {
		a.show(1-a.follow, slot, id, true)
	}
	if v.owed > 0 {
		a.owing--
	}
	v.owed, v.hidden = 0, false
}

// Update reports a change of n to both experts. A trim of the followed
// expert's victim commits the duel of that page.
func (a *Adaptive) Update(n policy.NodeInfo) {
	a.tick(n.Time)
	slot, fresh := a.nodes.Add(n.ID)
	v := a.nodes.At(slot)
	if !fresh && int32(n.Depth) == v.depth && int32(n.Pages) < v.pages && n.ID == a.chosen {
		a.commit(v)
	}
	a.chosen = 0
	a.hs.Update(n)
	a.resize(v, n)
	a.touch(slot, n.ID, n.LastAccess)
	v.tail = ghost.Key(&n.Tail)
	if v.owed > v.pages {
		v.owed = v.pages
	}
}

// commit records the duel of the eviction of chosen's tail page, v.
func (a *Adaptive) commit(v *node) {
	if v.owed > 0 {
		// NB: the other expert had evicted this page already (in its
		// sequence): both caches lose it, the difference shrinks.
		v.owed--
		if v.owed == 0 {
			a.owing--
		}
		return
	}
	if a.other == 0 || a.other == a.chosen {
		return
	}
	a.ghost.Add(v.tail, a.follow, int(a.peak))
	s, ok := a.nodes.Lookup(a.other)
	if !ok {
		return
	}
	o := a.nodes.At(s)
	if o.owed == 0 {
		a.owing++
		if !o.listed {
			o.listed = true
			a.debtors = append(a.debtors, a.other)
		}
	}
	o.owed++
	if o.owed >= o.pages && !o.hidden {
		o.hidden = true
		a.show(1-a.follow, s, a.other, false)
	}
	a.compactDebtors()
}

// compactDebtors drops listed nodes that no longer owe once the list is
// more than twice the debts, so it stays bounded by the live nodes.
func (a *Adaptive) compactDebtors() {
	if len(a.debtors) < 64 || len(a.debtors) <= 2*a.owing {
		return
	}
	kept := a.debtors[:0]
	for _, id := range a.debtors {
		if s, ok := a.nodes.Lookup(id); ok {
			if v := a.nodes.At(s); v.owed > 0 {
				kept = append(kept, id)
				continue
			} else {
				v.listed = false
			}
		}
	}
	a.debtors = kept
}

func (a *Adaptive) resize(v *node, n policy.NodeInfo) {
	a.pages += int64(n.Pages) - int64(v.pages)
	a.peak = max(a.peak, a.pages)
	v.pages, v.depth = int32(n.Pages), int32(n.Depth)
}

// Remove forgets id in both experts. The removal of the followed
// expert's victim commits the duel of its last page.
func (a *Adaptive) Remove(id policy.NodeID) {
	if s, ok := a.nodes.Lookup(id); ok {
		v := a.nodes.At(s)
		if id == a.chosen {
			a.commit(v)
		}
		if v.owed > 0 {
			a.owing--
		}
		a.pages -= int64(v.pages)
		a.lru.Remove(s)
		a.nodes.Delete(id)
	}
	a.chosen = 0
	a.hs.Remove(id)
}

// SetEvictable reports a change of candidates to both experts; a node
// hidden from the other expert stays hidden.
func (a *Adaptive) SetEvictable(id policy.NodeID, evictable bool) {
	s, ok := a.nodes.Lookup(id)
	if !ok {
		return
	}
	v := a.nodes.At(s)
	v.evictable = evictable
	a.show(a.follow, s, id, evictable)
	if !v.hidden {
		a.show(1-a.follow, s, id, evictable)
	}
}

// Finished reports the request to hindsight and looks its missed pages up
// in the duel ghost.
func (a *Adaptive) Finished(r policy.RequestInfo) {
	a.chosen = 0
	a.tick(r.Time)
	a.hs.Finished(r)
	if r.MatchedPages < 0 {
		return
	}
	for i := r.MatchedPages; i < len(r.Pages); i++ {
		a.recall(ghost.Key(&r.Pages[i]))
	}
}

// Victim returns the followed expert's victim and remembers the other's,
// so that the eviction that follows can be scored.
func (a *Adaptive) Victim() (policy.NodeID, bool) {
	id, ok := a.victim(a.follow)
	if !ok {
		return 0, false
	}
	a.chosen = id
	a.other, _ = a.victim(1 - a.follow)
	return id, true
}

// Check verifies both experts' invariants and the ghost; "" when they
// hold.
func (a *Adaptive) Check() string {
	if msg := a.hs.Check(); msg != "" {
		return "hindsight: " + msg
	}
	if msg := a.lru.Check(); msg != "" {
		return "lru heap: " + msg
	}
	if a.pages < 0 || a.pages > a.peak {
		return fmt.Sprintf("pages %d outside [0, peak %d]", a.pages, a.peak)
	}
	return a.ghost.Check()
}

package control

import (
	"fmt"

	"github.com/kvtier/kvtier/host/placement"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/tiers"
)

// ReqID names an engine request; the engine gives the same id on every
// rank.
type ReqID uint64

// OpID names one operation the Machine asked for. Ids are handed out in
// issue order, identically on every rank, and never reused (until a flush,
// which requires that none is in flight).
type OpID uint64

// Stage is the step of an operation a Done reports.
type Stage uint8

// The stages. An op of each kind finishes in one stage, except a spill,
// which finishes gathered, then durable.
const (
	// StageCopied: an L1↔L2 copy (backup or load-back) finished.
	StageCopied Stage = iota + 1
	// StageGathered: a spill's pages were copied off the slab; the slab
	// pages may be reused.
	StageGathered
	// StageDurable: a spill's pages are durable in the Store.
	StageDurable
	// StageLoaded: a reload's pages were read from the Store into the slab.
	StageLoaded
	// StageFound: a lookup's longest durable prefix is known (Longest).
	StageFound
)

var stageNames = [...]string{"", "copied", "gathered", "durable", "loaded", "found"}

// String returns the stage's name.
func (s Stage) String() string {
	if int(s) < len(stageNames) && s > 0 {
		return stageNames[s]
	}
	return fmt.Sprintf("stage(%d)", uint8(s))
}

// ParseStage reads a name String writes.
func ParseStage(s string) (Stage, error) {
	for i, n := range stageNames {
		if i > 0 && n == s {
			return Stage(i), nil
		}
	}
	return 0, fmt.Errorf("stage %q: want copied, gathered, durable, loaded or found", s)
}

// Direction is the way an L1↔L2 copy goes.
type Direction uint8

// The copy directions.
const (
	// ToL2 copies L1 pages into the slab (backup).
	ToL2 Direction = iota + 1
	// ToL1 copies slab pages into L1 (load-back).
	ToL1
)

// String returns "l1->l2" or "l2->l1".
func (d Direction) String() string {
	if d == ToL1 {
		return "l2->l1"
	}
	return "l1->l2"
}

// Placement tells where in L1 the pages of a newly inserted node live:
// the engine (or its pool) writes the node's KV there.
type Placement struct {
	// Req is the request whose insert made the node.
	Req ReqID
	// Node is the new node.
	Node policy.NodeID
	// L1 lists the node's L1 page ranges in page order.
	L1 []placement.Range
	// Depth is the position in the key of the node's first page (see
	// Copy.Depth).
	Depth int
}

// MatchResult is the answer to a match: how much of the request's key the
// tree holds and where.
type MatchResult struct {
	// Req is the request.
	Req ReqID
	// Node is the last node of the matched path (0: nothing matched); the
	// request's lock is on it, and a chunked prefill extends it.
	Node policy.NodeID
	// Pages is the number of leading pages of the key the tree holds.
	Pages int
	// L1 is how many of them are resident in L1 now; L2 how many more are
	// being loaded back from L2 (usable after the frontier commits the
	// load-back).
	L1, L2 int
	// Held says the request waits for a reload of the rest.
	Held bool
}

// Copy is one L1↔L2 copy of one node's pages.
type Copy struct {
	// Op is the operation; one op may cover several nodes.
	Op OpID
	// Dir is the direction.
	Dir Direction
	// Node is the node whose pages move.
	Node policy.NodeID
	// L1 lists the node's L1 page ranges, in page order.
	L1 []placement.Range
	// L2 lists the node's slab ranges (every kind), see placement.Range.
	L2 []placement.Range
	// Depth is the position in the key of the node's first page: page i
	// of a key belongs to owner lane i mod the lanes (OwnerOf), the rank
	// that holds its bytes in L1 and moves them between rank-local tiers.
	Depth int
}

// Put asks the Store to write a node's pages from the slab (a spill).
type Put struct {
	// Op is the operation; it finishes gathered, then durable.
	Op OpID
	// Node is the node spilled.
	Node policy.NodeID
	// Hashes are the pages' keys, in page order.
	Hashes []pagehash.Hash
	// Spans are one slab span per page per kind: kind 0's pages first.
	Spans []tiers.Span
	// Depth is the position in the key of Hashes[0] (see Copy.Depth).
	Depth int
}

// Lookup asks for the longest prefix of Hashes durable in the Store; the
// answer is given with Machine.Longest.
type Lookup struct {
	// Op is the operation.
	Op OpID
	// Hashes is the missed suffix of a request's key.
	Hashes []pagehash.Hash
	// Depth is the position in the key of Hashes[0] (see Copy.Depth).
	Depth int
}

// Get asks the Store to read pages into the slab (a reload).
type Get struct {
	// Op is the operation; it finishes loaded.
	Op OpID
	// Hashes are the pages' keys.
	Hashes []pagehash.Hash
	// Spans are the slab spans to read into, as in Put.
	Spans []tiers.Span
	// Depth is the position in the key of Hashes[0] (see Copy.Depth).
	Depth int
}

// Delete asks every rank to delete pages from the Store: a spill that
// failed on some rank is durable on none, so ranks that wrote it reclaim.
type Delete struct {
	// Op is the failed spill.
	Op OpID
	// Hashes are the pages.
	Hashes []pagehash.Hash
	// Depth is the position in the key of Hashes[0] (see Copy.Depth).
	Depth int
}

// Touch asks the Store to refresh the last access of pages (a reload).
type Touch struct {
	// Hashes are the pages.
	Hashes []pagehash.Hash
	// Depth is the position in the key of Hashes[0] (see Copy.Depth).
	Depth int
}

// OwnerOf returns the owner lane of the page at position i of a key:
// i mod lanes (lanes < 2: lane 0 owns every page).
func OwnerOf(i, lanes int) int {
	if lanes < 2 {
		return 0
	}
	return i % lanes
}

// HoldReason says why a held request was released.
type HoldReason uint8

// The reasons a hold ends.
const (
	// Loaded: the reload landed; the request re-matches and hits.
	Loaded HoldReason = iota + 1
	// Missed: nothing durable, the reload failed or could not attach:
	// the request recomputes.
	Missed
	// Present: the pages are already in the tree (a duplicate reload).
	Present
	// Expired: the hold outlived ReloadTTL ticks.
	Expired
	// Refused: the reservation did not fit (see the skip).
	Refused
)

var holdReasonNames = [...]string{"", "loaded", "missed", "present", "expired", "refused"}

// String returns the reason's name.
func (r HoldReason) String() string {
	if int(r) < len(holdReasonNames) && r > 0 {
		return holdReasonNames[r]
	}
	return fmt.Sprintf("hold_reason(%d)", uint8(r))
}

// Unhold releases a held request.
type Unhold struct {
	// Req is the request.
	Req ReqID
	// Reason says why.
	Reason HoldReason
}

// Ready is what the Machine asks its driver to do, and the local
// contribution it offers for the next tick. The driver consumes it and
// calls Advance.
//
// A Ready's Matches, Placements, Holds, Unholds and Skips are the
// driver's to keep: a driver may go on applying events while it walks
// them (serve matches a request again for each of a Ready's Unholds). Its
// work — Copies, Puts, Lookups, Gets, Deletes, Touches, and the ranges and
// spans inside them — is in the Machine's reused arrays: it stays valid
// until the next Advance after the one that handed it out, so a driver
// that takes the output, calls Advance and then carries the work out
// (host.Node.run) reads it intact; one that keeps it longer copies it.
type Ready struct {
	// Tick is the Machine's tick (the number of Tick calls so far).
	Tick uint64
	// Matches answer the match events, in order.
	Matches []MatchResult
	// Placements are the L1 pages given to new nodes.
	Placements []Placement
	// Copies are L1↔L2 copies to run.
	Copies []Copy
	// Puts, Lookups, Gets, Deletes and Touches are Store operations.
	Puts    []Put
	Lookups []Lookup
	Gets    []Get
	Deletes []Delete
	Touches []Touch
	// Holds are requests newly held for a reload; Unholds, released ones.
	Holds   []ReqID
	Unholds []Unhold
	// Skips are the decisions not taken, with their reasons.
	Skips []Skip
	// Contribution is this rank's progress, for the next frontier.
	Contribution Contribution
	// Digest is set every Options.DigestEvery ticks.
	Digest *[32]byte
}

// pending is the output accumulated since the last Advance.
type pending struct {
	matches    []MatchResult
	placements []Placement
	copies     []Copy
	puts       []Put
	lookups    []Lookup
	gets       []Get
	deletes    []Delete
	touches    []Touch
	holds      []ReqID
	unholds    []Unhold
	skips      []Skip
	digest     *[32]byte
}

// Ready returns the pending output and the current contribution. It
// changes nothing; Advance consumes the output.
func (m *Machine) Ready() Ready {
	rd := m.Output()
	rd.Contribution = m.Contribution()
	return rd
}

// Output is Ready without the contribution (its Contribution is zero): a
// driver that offers the contribution only at its ticks (Contribution)
// consumes the output of every event with it and skips building a
// contribution per event, which costs a walk of every pipeline's ops.
func (m *Machine) Output() Ready {
	p := &m.out
	return Ready{
		Tick:       m.tick,
		Matches:    p.matches,
		Placements: p.placements,
		Copies:     p.copies,
		Puts:       p.puts,
		Lookups:    p.lookups,
		Gets:       p.gets,
		Deletes:    p.deletes,
		Touches:    p.touches,
		Holds:      p.holds,
		Unholds:    p.unholds,
		Skips:      p.skips,
		Digest:     p.digest,
	}
}

// Advance drops the output Ready returned: the driver has acted on it.
//
// NB: matches, placements, holds, unholds and skips start afresh: a
// driver may walk them while it applies more events (serve matches a
// request again for each of a Ready's Unholds), and a first version that
// reused them would have had serve walk unholds a later Apply wrote over.
func (m *Machine) Advance() {
	// The work lists (copies, puts, lookups, gets, deletes, touches) are
	// double-buffered with the arena: only host.Node.run and the replays
	// read them, at once.
	w := m.spareWork
	m.spareWork = pending{copies: m.out.copies, puts: m.out.puts, lookups: m.out.lookups,
		gets: m.out.gets, deletes: m.out.deletes, touches: m.out.touches}
	m.out = pending{copies: w.copies[:0], puts: w.puts[:0], lookups: w.lookups[:0],
		gets: w.gets[:0], deletes: w.deletes[:0], touches: w.touches[:0]}
	m.arena.flip()
}

// HasReady reports whether there is output to consume.
func (m *Machine) HasReady() bool {
	p := &m.out
	return len(p.matches)+len(p.placements)+len(p.copies)+len(p.puts)+len(p.lookups)+len(p.gets)+
		len(p.deletes)+len(p.touches)+len(p.holds)+len(p.unholds)+len(p.skips) > 0 || p.digest != nil
}

// capped limits s to its length, so that a driver's append never writes
// into the arena.
func capped[T any](s []T) []T { return s[:len(s):len(s)] }

// arena cuts the ranges of the copies and the spans of the puts and gets
// of an output from reused arrays, double-buffered: the buffers Advance
// goes on in held the spans of the output it handed over before.
type arena struct {
	ranges arenaBuf[placement.Range]
	spans  arenaBuf[tiers.Span]
}

// flip moves to the other buffers, emptied: the output they held was
// handed out at the Advance before this one.
func (a *arena) flip() {
	a.ranges.flip()
	a.spans.flip()
}

// arenaBuf is one double-buffered array of an arena.
type arenaBuf[T any] struct {
	b   [2][]T
	cur int
}

func (a *arenaBuf[T]) flip() {
	a.cur ^= 1
	a.b[a.cur] = a.b[a.cur][:0]
}

// room returns an empty slice with room for n items at the end of the
// current buffer (a fresh buffer, of at least 256 items, when it has none:
// the slices already cut keep the old one).
func (a *arenaBuf[T]) room(n int) []T {
	b := a.b[a.cur]
	if cap(b)-len(b) < n {
		b = make([]T, 0, max(2*cap(b), n, 256))
		a.b[a.cur] = b
	}
	return b[len(b):]
}

// keep records that s, appended to a slice room returned, is in use, and
// returns it capped; an s that outgrew the room is its own array.
func (a *arenaBuf[T]) keep(room, s []T) []T {
	if len(s) > 0 && cap(s) == cap(room) && &s[:1][0] == &room[:1][0] {
		b := a.b[a.cur]
		a.b[a.cur] = b[:len(b)+len(s)]
	}
	return capped(s)
}

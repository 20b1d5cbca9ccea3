// Package consensus holds the rank group's pure values: the contribution a
// rank offers at a tick, the frontier every rank applies (element-wise MIN
// of counters, AND of ok bits), the Shape both must have, their canonical
// binary encoding and the comparison of replicated-state digests.
//
// It must never start a goroutine, read a clock or do I/O: transports live
// in its subpackages (inproc, tcpgroup, enginegroup, simgroup) and all of
// them reduce with Reduce, so a frontier never depends on which transport
// carried it. DESIGN §4 and §9 say why.
package consensus

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Bounds on a Shape, so that decoding a peer's bytes costs at most a few
// megabytes whatever the peer claims.
const (
	// MaxClasses is the largest number of operation classes.
	MaxClasses = 256
	// MaxOKBits is the largest number of ok bits.
	MaxOKBits = 1 << 20
	// MaxReloads is the largest number of reload candidates.
	MaxReloads = 1 << 20
	// MaxGroupSize is the largest number of ranks in a group.
	MaxGroupSize = 1 << 12
)

// Sentinel errors; transports and Reduce wrap them so callers can branch
// with errors.Is.
var (
	// ErrMalformed marks bytes that are not a valid encoding.
	ErrMalformed = errors.New("malformed contribution")
	// ErrShape marks a contribution or frontier whose shape differs from
	// the one expected at that tick.
	ErrShape = errors.New("shape mismatch")
	// ErrForeign marks a peer of another group or another stack, or a rank
	// outside the group.
	ErrForeign = errors.New("peer of another group")
	// ErrTick marks a contribution for the wrong tick: a replayed old one,
	// one from the future, or ticks that do not increase.
	ErrTick = errors.New("wrong tick")
	// ErrDigestMismatch marks ranks whose replicated state differs.
	ErrDigestMismatch = errors.New("replicated state digests differ")
	// ErrTimeout marks a rank that did not answer within the deadline.
	ErrTimeout = errors.New("rank did not answer within the deadline")
	// ErrStopped marks a group that failed before: it refuses every later
	// exchange (health goes not-ready) rather than risk a divergent tick.
	ErrStopped = errors.New("group stopped")
	// ErrProbe marks an exchange attempted from inside a split or prune
	// probe: collectives run only from the tick (DESIGN §4.3).
	ErrProbe = errors.New("exchange from inside a probe")
)

// Counts are one class's counters of finished operations, each the length
// of the prefix of that class's operations the rank finished.
type Counts struct {
	// Gathered counts spills whose pages were gathered off the slab.
	Gathered uint64
	// Durable counts spills durable in the Store.
	Durable uint64
	// Reloaded counts L3→L2 reloads finished.
	Reloaded uint64
	// L1Copied counts L1↔L2 copies finished.
	L1Copied uint64
}

func (c Counts) min(o Counts) Counts {
	return Counts{
		Gathered: min(c.Gathered, o.Gathered),
		Durable:  min(c.Durable, o.Durable),
		Reloaded: min(c.Reloaded, o.Reloaded),
		L1Copied: min(c.L1Copied, o.L1Copied),
	}
}

// Structure names one replicated structure with its own digest.
type Structure int

// The replicated structures, in the order of Contribution.Structures.
const (
	// StructTree is the radix tree's shape.
	StructTree Structure = iota
	// StructPlacement is the L2 placement (free lists, object ranges).
	StructPlacement
	// StructMarkers is the replicated node markers.
	StructMarkers
	// StructQueues is the spill queue and reload holds.
	StructQueues
	// NumStructures is the number of structures.
	NumStructures
)

var structureNames = [NumStructures]string{"tree", "placement", "markers", "queues"}

// String returns the structure's name.
func (s Structure) String() string {
	if s >= 0 && s < NumStructures {
		return structureNames[s]
	}
	return fmt.Sprintf("structure(%d)", int(s))
}

// Digest is a SHA-256 of canonical replicated state.
type Digest [32]byte

// String returns the first 8 bytes in hex, enough to tell two apart in a
// log line.
func (d Digest) String() string { return hex.EncodeToString(d[:8]) }

// Shape is the size of every vector of a tick. It is computed from
// replicated state only (how many classes, how many reload candidates are
// open), so it is the same on every rank whatever each rank did; a
// contribution of another shape is refused.
type Shape struct {
	// Classes is the number of operation classes (len of Counts).
	Classes int
	// OKBits is the number of ok bits.
	OKBits int
	// Reloads is the number of reload candidates (len of Prefix).
	Reloads int
	// Digest says whether the tick carries a digest of the replicated
	// state (every N ticks).
	Digest bool
	// Structures is 0, or NumStructures when the digest tick also carries
	// one digest per structure.
	Structures int
}

// Validate says whether the shape is within bounds.
func (s Shape) Validate() error {
	switch {
	case s.Classes < 0 || s.Classes > MaxClasses:
		return fmt.Errorf("shape: %d classes, want 0..%d: %w", s.Classes, MaxClasses, ErrShape)
	case s.OKBits < 0 || s.OKBits > MaxOKBits:
		return fmt.Errorf("shape: %d ok bits, want 0..%d: %w", s.OKBits, MaxOKBits, ErrShape)
	case s.Reloads < 0 || s.Reloads > MaxReloads:
		return fmt.Errorf("shape: %d reload candidates, want 0..%d: %w", s.Reloads, MaxReloads, ErrShape)
	case s.Structures != 0 && s.Structures != int(NumStructures):
		return fmt.Errorf("shape: %d structure digests, want 0 or %d: %w", s.Structures, NumStructures, ErrShape)
	case s.Structures != 0 && !s.Digest:
		return fmt.Errorf("shape: structure digests without a digest: %w", ErrShape)
	}
	return nil
}

// String renders the shape, e.g. "classes=2 ok=3 reloads=1 digest+4".
func (s Shape) String() string {
	d := ""
	if s.Digest {
		d = fmt.Sprintf(" digest+%d", s.Structures)
	}
	return fmt.Sprintf("classes=%d ok=%d reloads=%d%s", s.Classes, s.OKBits, s.Reloads, d)
}

// Contribution is one rank's local facts at a tick.
type Contribution struct {
	// Tick is the replicated tick the contribution is for.
	Tick uint64
	// Shape is the tick's shape; the vectors below must match it.
	Shape Shape
	// Counts holds Shape.Classes counters.
	Counts []Counts
	// OK holds Shape.OKBits outcome bits (true: succeeded on this rank).
	OK []bool
	// Prefix holds, per reload candidate, the longest prefix in pages this
	// rank found durable.
	Prefix []uint32
	// Digest is the digest of the rank's replicated state, when
	// Shape.Digest.
	Digest Digest
	// Structures holds Shape.Structures per-structure digests, indexed by
	// Structure.
	Structures []Digest
}

// NewContribution returns a contribution of the given shape, counters at
// zero and ok bits set, which is the neutral element of Reduce's AND.
func NewContribution(tick uint64, s Shape) Contribution {
	c := Contribution{
		Tick: tick, Shape: s,
		Counts: make([]Counts, s.Classes),
		OK:     make([]bool, s.OKBits),
		Prefix: make([]uint32, s.Reloads),
	}
	for i := range c.OK {
		c.OK[i] = true
	}
	if s.Structures > 0 {
		c.Structures = make([]Digest, s.Structures)
	}
	return c
}

// Check says whether the vectors match the contribution's own shape.
func (c Contribution) Check() error {
	if err := c.Shape.Validate(); err != nil {
		return err
	}
	s := c.Shape
	switch {
	case len(c.Counts) != s.Classes:
		return fmt.Errorf("%d classes of counts, shape has %d: %w", len(c.Counts), s.Classes, ErrShape)
	case len(c.OK) != s.OKBits:
		return fmt.Errorf("%d ok bits, shape has %d: %w", len(c.OK), s.OKBits, ErrShape)
	case len(c.Prefix) != s.Reloads:
		return fmt.Errorf("%d reload prefixes, shape has %d: %w", len(c.Prefix), s.Reloads, ErrShape)
	case len(c.Structures) != s.Structures:
		return fmt.Errorf("%d structure digests, shape has %d: %w", len(c.Structures), s.Structures, ErrShape)
	case !s.Digest && c.Digest != (Digest{}):
		return fmt.Errorf("a digest on a tick without one: %w", ErrShape)
	}
	return nil
}

// Equal says whether two contributions are identical.
func (c Contribution) Equal(o Contribution) bool {
	if c.Tick != o.Tick || c.Shape != o.Shape || c.Digest != o.Digest ||
		len(c.Counts) != len(o.Counts) || len(c.OK) != len(o.OK) ||
		len(c.Prefix) != len(o.Prefix) || len(c.Structures) != len(o.Structures) {
		return false
	}
	for i := range c.Counts {
		if c.Counts[i] != o.Counts[i] {
			return false
		}
	}
	for i := range c.OK {
		if c.OK[i] != o.OK[i] {
			return false
		}
	}
	for i := range c.Prefix {
		if c.Prefix[i] != o.Prefix[i] {
			return false
		}
	}
	for i := range c.Structures {
		if c.Structures[i] != o.Structures[i] {
			return false
		}
	}
	return true
}

// Frontier is what every rank applies at a tick: per class the MIN of the
// ranks' counters, the AND of their ok bits, the MIN of their reload
// prefixes, and, on a digest tick, the digest all ranks agreed on.
type Frontier Contribution

// Equal says whether two frontiers are identical.
func (f Frontier) Equal(o Frontier) bool { return Contribution(f).Equal(Contribution(o)) }

// Check says whether the frontier's vectors match its shape.
func (f Frontier) Check() error { return Contribution(f).Check() }

// PeerError names the peer and the tick a refusal or failure is about.
type PeerError struct {
	// Peer names the rank, e.g. "rank 3" or "rank 3 (127.0.0.1:4000)".
	Peer string
	// Tick is the tick, when known.
	Tick uint64
	// TickKnown is false when the bytes ended before the tick.
	TickKnown bool
	// Err is the cause; it wraps one of the sentinel errors.
	Err error
}

// Error implements error.
func (e *PeerError) Error() string {
	if !e.TickKnown {
		return fmt.Sprintf("consensus: %s at an unknown tick: %v", e.Peer, e.Err)
	}
	return fmt.Sprintf("consensus: %s at tick %d: %v", e.Peer, e.Tick, e.Err)
}

// Unwrap returns the cause.
func (e *PeerError) Unwrap() error { return e.Err }

// RankName is the peer name of rank r used in errors.
func RankName(r int) string { return fmt.Sprintf("rank %d", r) }

// MismatchError reports ranks whose digests differ at a tick.
type MismatchError struct {
	// Tick is the digest tick.
	Tick uint64
	// RankA and RankB are two ranks that disagree (RankA is the
	// reference: rank 0 in Reduce, -1 for a frontier that arrived from
	// elsewhere).
	RankA, RankB int
	// DigestA and DigestB are their whole-state digests.
	DigestA, DigestB Digest
	// Structure is the first structure whose digests differ, or -1 when
	// the contributions carry no per-structure digests (or those agree).
	Structure Structure
	// StructA and StructB are that structure's digests, when Structure >= 0.
	StructA, StructB Digest
}

// Error implements error.
func (e *MismatchError) Error() string {
	where := "no per-structure digests"
	if e.Structure >= 0 {
		where = fmt.Sprintf("first differing structure %s (%s vs %s)", e.Structure, e.StructA, e.StructB)
	}
	a := RankName(e.RankA)
	if e.RankA < 0 {
		a = "group frontier"
	}
	return fmt.Sprintf("consensus: tick %d: %s digest %s, %s digest %s; %s: %v",
		e.Tick, a, e.DigestA, RankName(e.RankB), e.DigestB, where, ErrDigestMismatch)
}

// Unwrap returns ErrDigestMismatch.
func (e *MismatchError) Unwrap() error { return ErrDigestMismatch }

// CompareDigests compares b's digests against the reference a (ranks
// ra and rb) and returns a *MismatchError naming the first differing
// structure, or nil when they agree or the tick carries no digest.
func CompareDigests(tick uint64, ra int, a Contribution, rb int, b Contribution) error {
	if !a.Shape.Digest || !b.Shape.Digest {
		return nil
	}
	if a.Digest == b.Digest && equalDigests(a.Structures, b.Structures) {
		return nil
	}
	e := &MismatchError{Tick: tick, RankA: ra, RankB: rb, DigestA: a.Digest, DigestB: b.Digest, Structure: -1}
	for i := 0; i < len(a.Structures) && i < len(b.Structures); i++ {
		if a.Structures[i] != b.Structures[i] {
			e.Structure, e.StructA, e.StructB = Structure(i), a.Structures[i], b.Structures[i]
			break
		}
	}
	return e
}

func equalDigests(a, b []Digest) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i][:], b[i][:]) {
			return false
		}
	}
	return true
}

// Reduce combines the contributions of every rank of a group, indexed by
// rank, into the frontier. All must be for tick and have the shape of
// contribution 0; the error for one that does not is a *PeerError naming
// its rank. On a digest tick the digests are compared and a mismatch is a
// *MismatchError. Reduce does not modify cs.
func Reduce(tick uint64, cs []Contribution) (Frontier, error) {
	if len(cs) == 0 {
		return Frontier{}, fmt.Errorf("consensus: reduce at tick %d: no contributions: %w", tick, ErrShape)
	}
	shape := cs[0].Shape
	for r, c := range cs {
		if err := checkAgainst(c, tick, shape); err != nil {
			return Frontier{}, &PeerError{Peer: RankName(r), Tick: c.Tick, TickKnown: true, Err: err}
		}
	}
	for r := 1; r < len(cs); r++ {
		if err := CompareDigests(tick, 0, cs[0], r, cs[r]); err != nil {
			return Frontier{}, err
		}
	}
	f := Frontier(NewContribution(tick, shape))
	f.Digest = cs[0].Digest
	copy(f.Structures, cs[0].Structures)
	for i := range f.Counts {
		f.Counts[i] = cs[0].Counts[i]
	}
	for i := range f.Prefix {
		f.Prefix[i] = cs[0].Prefix[i]
	}
	for _, c := range cs {
		for i := range f.Counts {
			f.Counts[i] = f.Counts[i].min(c.Counts[i])
		}
		for i := range f.OK {
			f.OK[i] = f.OK[i] && c.OK[i]
		}
		for i := range f.Prefix {
			f.Prefix[i] = min(f.Prefix[i], c.Prefix[i])
		}
	}
	return f, nil
}

// checkAgainst checks c against the expected tick and shape.
func checkAgainst(c Contribution, tick uint64, shape Shape) error {
	if c.Tick != tick {
		return fmt.Errorf("contribution for tick %d, exchange at tick %d: %w", c.Tick, tick, ErrTick)
	}
	if c.Shape != shape {
		return fmt.Errorf("shape %s, group expects %s: %w", c.Shape, shape, ErrShape)
	}
	return c.Check()
}

// CheckFrontier checks a frontier that arrived from elsewhere (a hub, an
// engine) against the local contribution it answers: same tick and shape,
// no counter or prefix above the local one (a MIN cannot exceed any of its
// inputs), no ok bit set that the local one clears, and on a digest tick
// the local digests. self names the local rank in errors.
func CheckFrontier(self int, c Contribution, f Frontier) error {
	if err := checkAgainst(Contribution(f), c.Tick, c.Shape); err != nil {
		return fmt.Errorf("consensus: frontier for %s: %w", RankName(self), err)
	}
	for i := range f.Counts {
		if f.Counts[i].min(c.Counts[i]) != f.Counts[i] {
			return fmt.Errorf("consensus: frontier at tick %d: class %d counts %+v above %s's %+v: %w", c.Tick, i, f.Counts[i], RankName(self), c.Counts[i], ErrShape)
		}
	}
	for i := range f.OK {
		if f.OK[i] && !c.OK[i] {
			return fmt.Errorf("consensus: frontier at tick %d: ok bit %d set, %s failed it: %w", c.Tick, i, RankName(self), ErrShape)
		}
	}
	for i := range f.Prefix {
		if f.Prefix[i] > c.Prefix[i] {
			return fmt.Errorf("consensus: frontier at tick %d: reload %d prefix %d above %s's %d: %w", c.Tick, i, f.Prefix[i], RankName(self), c.Prefix[i], ErrShape)
		}
	}
	return CompareDigests(c.Tick, -1, Contribution(f), self, c)
}

// String renders the contribution on one line, e.g. "tick=7
// counts=[5/2/3/2 1/9/9/9] ok=100 prefix=[4 2]" (counts as
// gathered/durable/reloaded/l1copied per class, ok bits as 1 and 0), with
// the digests on a digest tick.
func (c Contribution) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "tick=%d counts=[", c.Tick)
	for i, k := range c.Counts {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%d/%d/%d/%d", k.Gathered, k.Durable, k.Reloaded, k.L1Copied)
	}
	b.WriteString("] ok=")
	for _, ok := range c.OK {
		if ok {
			b.WriteByte('1')
		} else {
			b.WriteByte('0')
		}
	}
	fmt.Fprintf(&b, " prefix=%v", c.Prefix)
	if c.Shape.Digest {
		fmt.Fprintf(&b, " digest=%s", c.Digest)
		for i, d := range c.Structures {
			fmt.Fprintf(&b, " %s=%s", Structure(i), d)
		}
	}
	return b.String()
}

// String renders the frontier like Contribution.String.
func (f Frontier) String() string { return Contribution(f).String() }

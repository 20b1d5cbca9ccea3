package consensus

import (
	"context"
	"fmt"
	"slices"
)

// Group is one rank's handle on its rank group. It is bound at creation to
// a group of fixed size and to its rank in it, so an exchange over another
// group cannot be written. Exchange is called once per tick, ticks
// strictly increasing, from the tick's globally ordered code path only
// (never from a probe), and by one goroutine at a time.
type Group interface {
	// Rank is this member's rank, 0 <= Rank < Size.
	Rank() int
	// Size is the number of ranks of the group.
	Size() int
	// Exchange offers c for tick and returns the group's frontier: the
	// same value on every rank, or an error on every rank that returns.
	// An error that names a rank and the tick stops the group: every
	// later Exchange fails with ErrStopped.
	Exchange(ctx context.Context, tick uint64, c Contribution) (Frontier, error)
}

// TickGuard enforces strictly increasing ticks on one member.
type TickGuard struct {
	last    uint64
	started bool
}

// Next accepts tick for rank when it is above every tick before it and c
// is for it.
func (g *TickGuard) Next(rank int, tick uint64, c Contribution) error {
	if c.Tick != tick {
		return &PeerError{Peer: RankName(rank), Tick: tick, TickKnown: true, Err: fmt.Errorf("contribution for tick %d: %w", c.Tick, ErrTick)}
	}
	if g.started && tick <= g.last {
		return &PeerError{Peer: RankName(rank), Tick: tick, TickKnown: true, Err: fmt.Errorf("tick not above the last exchanged %d: %w", g.last, ErrTick)}
	}
	g.last, g.started = tick, true
	return nil
}

// Clone returns a deep copy of f, so ranks of one process never share the
// frontier's slices.
func (f Frontier) Clone() Frontier {
	f.Counts = slices.Clone(f.Counts)
	f.OK = slices.Clone(f.OK)
	f.Prefix = slices.Clone(f.Prefix)
	f.Structures = slices.Clone(f.Structures)
	return f
}

// Clone returns a deep copy of c.
func (c Contribution) Clone() Contribution { return Contribution(Frontier(c).Clone()) }

// MissingError builds the error for ranks that did not contribute to tick
// within the deadline: it names the first missing rank and lists all.
func MissingError(tick uint64, missing []int, deadline string) error {
	if len(missing) == 0 {
		return nil
	}
	return &PeerError{
		Peer: RankName(missing[0]), Tick: tick, TickKnown: true,
		Err: fmt.Errorf("no contribution within %s (ranks missing: %v): %w", deadline, missing, ErrTimeout),
	}
}

// Stopped wraps the error that stopped a group for a later exchange at
// tick by rank.
func Stopped(rank int, tick uint64, cause error) error {
	return fmt.Errorf("consensus: %s exchange at tick %d refused: %w (first failure: %w)", RankName(rank), tick, ErrStopped, cause)
}

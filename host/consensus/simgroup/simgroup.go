// Package simgroup is a rank group for tests: the in-process group with
// seeded per-rank delays (so ranks arrive in a different order at every
// tick), operations that fail on one rank, ranks that stall or crash, and
// a probe flag under which every exchange is refused — the seed's Gloo
// abort came from a collective issued inside a split probe, and a test
// that runs probes over this group proves none does.
package simgroup

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/host/consensus/inproc"
)

// FaultKind is what goes wrong.
type FaultKind int

const (
	// FailOp clears ok bit Bit of the rank's contribution: one of its
	// operations failed, so the frontier must say failed on every rank.
	FailOp FaultKind = iota + 1
	// Stall: the rank never arrives (it blocks until its context ends);
	// the others must fail naming it within the deadline.
	Stall
	// Crash: the rank returns an error without contributing, as if its
	// process died.
	Crash
)

// Fault is one injected fault.
type Fault struct {
	// Rank and Tick say where.
	Rank int
	Tick uint64
	// Kind says what.
	Kind FaultKind
	// Bit is the ok bit FailOp clears.
	Bit int
}

// ErrCrashed is returned by a rank a Crash fault hit.
var ErrCrashed = errors.New("simgroup: rank crashed by an injected fault")

// Options configure a simulated group.
type Options struct {
	// Seed seeds every rank's delays (rank r uses the stream (Seed, r)).
	Seed uint64
	// MaxDelay is the largest random delay before a rank arrives; 0 means
	// only random yields (reordering without sleeping).
	MaxDelay time.Duration
	// OpFailRate is the probability that each ok bit of each rank's
	// contribution is cleared (an operation failed on that rank).
	OpFailRate float64
	// Faults are injected at their rank and tick.
	Faults []Fault
	// Timeout is the exchange deadline of the underlying in-process group.
	Timeout time.Duration
}

// Group is the shared state of a simulated group.
type Group struct {
	probe   atomic.Bool
	members []*Member
}

// Member is one rank's handle; it implements consensus.Group.
type Member struct {
	g      *Group
	inner  *inproc.Member
	rng    *rand.Rand
	opts   Options
	faults map[uint64][]Fault
	failed atomic.Uint64
}

var _ consensus.Group = (*Member)(nil)

// New returns a simulated group of size ranks.
func New(size int, opts Options) (*Group, error) {
	if opts.Timeout == 0 {
		opts.Timeout = inproc.DefaultOptions().Timeout
	}
	if opts.OpFailRate < 0 || opts.OpFailRate > 1 || opts.MaxDelay < 0 {
		return nil, fmt.Errorf("simgroup: op fail rate %v must be in [0,1], max delay %v not negative", opts.OpFailRate, opts.MaxDelay)
	}
	inner, err := inproc.New(size, inproc.Options{Timeout: opts.Timeout})
	if err != nil {
		return nil, fmt.Errorf("simgroup: %w", err)
	}
	g := &Group{}
	for r, in := range inner {
		m := &Member{g: g, inner: in, rng: rand.New(rand.NewPCG(opts.Seed, uint64(r))), opts: opts, faults: map[uint64][]Fault{}}
		for _, f := range opts.Faults {
			if f.Rank < 0 || f.Rank >= size {
				return nil, fmt.Errorf("simgroup: fault for rank %d of a group of %d", f.Rank, size)
			}
			if f.Rank == r {
				m.faults[f.Tick] = append(m.faults[f.Tick], f)
			}
		}
		g.members = append(g.members, m)
	}
	return g, nil
}

// Members returns the members, indexed by rank.
func (g *Group) Members() []*Member { return g.members }

// Probe runs fn with the probe flag set: every Exchange called meanwhile,
// by any rank, fails with consensus.ErrProbe (and does not take part in
// the tick).
func (g *Group) Probe(fn func()) {
	g.probe.Store(true)
	defer g.probe.Store(false)
	fn()
}

// Rank implements consensus.Group.
func (m *Member) Rank() int { return m.inner.Rank() }

// Size implements consensus.Group.
func (m *Member) Size() int { return m.inner.Size() }

// FailedOps is the number of ok bits this rank's faults cleared.
func (m *Member) FailedOps() uint64 { return m.failed.Load() }

// Exchange implements consensus.Group with the member's delays and faults.
func (m *Member) Exchange(ctx context.Context, tick uint64, c consensus.Contribution) (consensus.Frontier, error) {
	if m.g.probe.Load() {
		return consensus.Frontier{}, &consensus.PeerError{Peer: consensus.RankName(m.Rank()), Tick: tick, TickKnown: true,
			Err: fmt.Errorf("simgroup: %w", consensus.ErrProbe)}
	}
	cloned := false
	fail := func(bit int) {
		if bit < 0 || bit >= len(c.OK) || !c.OK[bit] {
			return
		}
		if !cloned {
			c, cloned = c.Clone(), true
		}
		c.OK[bit] = false
		m.failed.Add(1)
	}
	if m.opts.OpFailRate > 0 {
		for i := range c.OK {
			if m.rng.Float64() < m.opts.OpFailRate {
				fail(i)
			}
		}
	}
	for _, f := range m.faults[tick] {
		switch f.Kind {
		case FailOp:
			fail(f.Bit)
		case Stall:
			<-ctx.Done()
			return consensus.Frontier{}, fmt.Errorf("simgroup: %s stalled at tick %d: %w", consensus.RankName(m.Rank()), tick, ctx.Err())
		case Crash:
			return consensus.Frontier{}, fmt.Errorf("%w: %s at tick %d", ErrCrashed, consensus.RankName(m.Rank()), tick)
		}
	}
	for range m.rng.IntN(4) {
		runtime.Gosched()
	}
	if m.opts.MaxDelay > 0 {
		time.Sleep(time.Duration(m.rng.Int64N(int64(m.opts.MaxDelay))))
	}
	return m.inner.Exchange(ctx, tick, c)
}

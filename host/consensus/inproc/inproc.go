// Package inproc is the rank group for ranks served by one process: the
// members meet in memory, the last to arrive reduces, and a rank that does
// not arrive within the deadline stops the group with an error naming it.
package inproc

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kvtier/kvtier/host/consensus"
)

// Options configure a group.
type Options struct {
	// Timeout bounds an exchange, counted from the first rank's arrival
	// at the tick; default 5s.
	Timeout time.Duration
}

// DefaultOptions returns the defaults.
func DefaultOptions() Options { return Options{Timeout: 5 * time.Second} }

// Validate checks the options.
func (o Options) Validate() error {
	if o.Timeout <= 0 {
		return fmt.Errorf("inproc: timeout %v must be positive", o.Timeout)
	}
	return nil
}

type round struct {
	tick   uint64
	opened time.Time
	cs     []consensus.Contribution
	have   []bool
	n      int
	done   chan struct{}
	f      consensus.Frontier
	err    error
}

type hub struct {
	size    int
	opts    Options
	mu      sync.Mutex
	cur     *round
	stopped error
}

// Member is one rank's handle; it implements consensus.Group.
type Member struct {
	h     *hub
	rank  int
	guard consensus.TickGuard
}

var _ consensus.Group = (*Member)(nil)

// New returns the members of a group of size ranks, indexed by rank.
func New(size int, opts Options) ([]*Member, error) {
	if size < 1 || size > consensus.MaxGroupSize {
		return nil, fmt.Errorf("inproc: group size %d, want 1..%d", size, consensus.MaxGroupSize)
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	h := &hub{size: size, opts: opts}
	ms := make([]*Member, size)
	for r := range ms {
		ms[r] = &Member{h: h, rank: r}
	}
	return ms, nil
}

// Rank implements consensus.Group.
func (m *Member) Rank() int { return m.rank }

// Size implements consensus.Group.
func (m *Member) Size() int { return m.h.size }

// Err returns the error that stopped the group, or nil while it is healthy
// (for a readiness probe).
func (m *Member) Err() error {
	m.h.mu.Lock()
	defer m.h.mu.Unlock()
	return m.h.stopped
}

// Exchange implements consensus.Group.
func (m *Member) Exchange(ctx context.Context, tick uint64, c consensus.Contribution) (consensus.Frontier, error) {
	if err := m.guard.Next(m.rank, tick, c); err != nil {
		return consensus.Frontier{}, m.h.stop(err)
	}
	rd, err := m.h.arrive(m.rank, tick, c.Clone())
	if err != nil {
		return consensus.Frontier{}, err
	}
	timer := time.NewTimer(time.Until(rd.opened.Add(m.h.opts.Timeout)))
	defer timer.Stop()
	select {
	case <-rd.done:
	case <-timer.C:
		m.h.expire(rd)
	case <-ctx.Done():
		// NB: this rank leaves; the others time out naming it, which is the
		// truth: it did not finish the tick. The error is the context's
		// cause (ctx.Err() when none was given), so a caller that ended
		// the exchange for a reason hears it.
		return consensus.Frontier{}, fmt.Errorf("inproc: %s at tick %d: %w", consensus.RankName(m.rank), tick, context.Cause(ctx))
	}
	if rd.err != nil {
		return consensus.Frontier{}, rd.err
	}
	return rd.f.Clone(), nil
}

func (h *hub) stop(err error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped == nil {
		h.stopped = err
	}
	if h.cur != nil && h.cur.err == nil && h.cur.n < h.size {
		h.cur.err = err
		close(h.cur.done)
	}
	return err
}

func (h *hub) arrive(rank int, tick uint64, c consensus.Contribution) (*round, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped != nil {
		return nil, consensus.Stopped(rank, tick, h.stopped)
	}
	rd := h.cur
	if rd == nil || rd.n == h.size {
		rd = &round{tick: tick, opened: time.Now(), cs: make([]consensus.Contribution, h.size), have: make([]bool, h.size), done: make(chan struct{})}
		h.cur = rd
	}
	if rd.tick != tick {
		// Ranks at different ticks: no frontier may come out of this.
		err := &consensus.PeerError{Peer: consensus.RankName(rank), Tick: tick, TickKnown: true,
			Err: fmt.Errorf("arrived while the group is at tick %d: %w", rd.tick, consensus.ErrTick)}
		h.stopped, rd.err = err, err
		close(rd.done)
		return nil, err
	}
	rd.cs[rank], rd.have[rank] = c, true
	rd.n++
	if rd.n == h.size {
		rd.f, rd.err = consensus.Reduce(tick, rd.cs)
		if rd.err != nil {
			h.stopped = rd.err
		}
		rd.cs = nil
		close(rd.done)
	}
	return rd, nil
}

func (h *hub) expire(rd *round) {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-rd.done:
		return
	default:
	}
	var missing []int
	for r, ok := range rd.have {
		if !ok {
			missing = append(missing, r)
		}
	}
	rd.err = fmt.Errorf("inproc: %w", consensus.MissingError(rd.tick, missing, h.opts.Timeout.String()))
	if h.stopped == nil {
		h.stopped = rd.err
	}
	rd.n = h.size // no later arrival joins this round
	close(rd.done)
}

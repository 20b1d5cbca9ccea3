// Package enginegroup is the rank group whose collective the inference
// engine runs: Exchange publishes the rank's contribution, the engine
// all-reduces it with its own process group (as SGLang all-reduces its
// counters) and passes the frontier back in its next call, and Deliver
// checks that frontier against the contribution before Exchange returns
// it. kvtier itself sends nothing over the network here.
package enginegroup

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kvtier/kvtier/host/consensus"
)

// ErrNoExchange marks a frontier delivered while no exchange waits for one.
var ErrNoExchange = errors.New("no exchange pending")

type result struct {
	f   consensus.Frontier
	err error
}

// Member is one rank's handle; it implements consensus.Group.
type Member struct {
	rank, size int
	env        consensus.Envelope
	guard      consensus.TickGuard

	mu      sync.Mutex
	pending *consensus.Contribution
	reply   chan result
	stopped error
	// published is signalled (without blocking) each time Exchange
	// publishes a contribution.
	published chan struct{}
}

var _ consensus.Group = (*Member)(nil)

// New returns rank's member of a group of size ranks; group and stack
// identify it in DeliverEncoded.
func New(rank, size int, group, stack uint64) (*Member, error) {
	if size < 1 || size > consensus.MaxGroupSize || rank < 0 || rank >= size {
		return nil, fmt.Errorf("enginegroup: rank %d of a group of %d (size 1..%d)", rank, size, consensus.MaxGroupSize)
	}
	return &Member{rank: rank, size: size, env: consensus.Envelope{Group: group, Stack: stack, Rank: rank, Size: size},
		published: make(chan struct{}, 1)}, nil
}

// Published is signalled each time Exchange publishes a contribution (a
// caller that starts a tick waits on it, then reads PendingEncoded). The
// signal is level-triggered at most once: drain it before starting the
// exchange it waits for.
func (m *Member) Published() <-chan struct{} { return m.published }

// Rank implements consensus.Group.
func (m *Member) Rank() int { return m.rank }

// Size implements consensus.Group.
func (m *Member) Size() int { return m.size }

// Err returns the error that stopped the group, or nil.
func (m *Member) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stopped
}

// Pending returns the contribution waiting for the engine's all-reduce,
// and false when no exchange is in progress.
func (m *Member) Pending() (consensus.Contribution, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pending == nil {
		return consensus.Contribution{}, false
	}
	return m.pending.Clone(), true
}

// PendingEncoded returns the pending contribution in the wire encoding.
func (m *Member) PendingEncoded() ([]byte, bool, error) {
	c, ok := m.Pending()
	if !ok {
		return nil, false, nil
	}
	b, err := consensus.AppendContribution(nil, m.env, c)
	return b, true, err
}

// Exchange implements consensus.Group: it publishes c and waits for the
// engine's frontier (Deliver) or ctx.
func (m *Member) Exchange(ctx context.Context, tick uint64, c consensus.Contribution) (consensus.Frontier, error) {
	m.mu.Lock()
	if m.stopped != nil {
		m.mu.Unlock()
		return consensus.Frontier{}, consensus.Stopped(m.rank, tick, m.stopped)
	}
	if err := m.guard.Next(m.rank, tick, c); err != nil {
		m.stopped = err
		m.mu.Unlock()
		return consensus.Frontier{}, err
	}
	if err := c.Check(); err != nil {
		m.stopped = &consensus.PeerError{Peer: consensus.RankName(m.rank), Tick: tick, TickKnown: true, Err: err}
		m.mu.Unlock()
		return consensus.Frontier{}, m.stopped
	}
	c = c.Clone()
	reply := make(chan result, 1)
	m.pending, m.reply = &c, reply
	m.mu.Unlock()
	select {
	case m.published <- struct{}{}:
	default:
	}
	select {
	case r := <-reply:
		return r.f, r.err
	case <-ctx.Done():
		m.mu.Lock()
		if m.reply == reply {
			m.pending, m.reply = nil, nil
		}
		m.mu.Unlock()
		return consensus.Frontier{}, fmt.Errorf("enginegroup: %s at tick %d: waiting for the engine's frontier: %w", consensus.RankName(m.rank), tick, ctx.Err())
	}
}

// Deliver hands the engine's frontier to the waiting Exchange. A frontier
// that does not fit the pending contribution (another tick or shape, a
// counter above this rank's, an ok bit this rank failed, other digests)
// stops the group: the error goes to both the engine and Exchange.
func (m *Member) Deliver(f consensus.Frontier) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pending == nil {
		return &consensus.PeerError{Peer: "the engine", Tick: f.Tick, TickKnown: true, Err: fmt.Errorf("enginegroup: frontier for %s: %w", consensus.RankName(m.rank), ErrNoExchange)}
	}
	c, reply := *m.pending, m.reply
	m.pending, m.reply = nil, nil
	if err := consensus.CheckFrontier(m.rank, c, f); err != nil {
		err = &consensus.PeerError{Peer: "the engine", Tick: f.Tick, TickKnown: true, Err: fmt.Errorf("enginegroup: %w", err)}
		m.stopped = err
		reply <- result{err: err}
		return err
	}
	reply <- result{f: f.Clone()}
	return nil
}

// DeliverEncoded decodes a frontier in the wire encoding and delivers it.
func (m *Member) DeliverEncoded(b []byte) error {
	_, f, err := consensus.DecodeFrontier(b, consensus.Expect{Group: m.env.Group, Stack: m.env.Stack, Size: m.size, Peer: "the engine"})
	if err != nil {
		m.mu.Lock()
		if m.pending != nil {
			m.stopped = err
			m.reply <- result{err: err}
			m.pending, m.reply = nil, nil
		}
		m.mu.Unlock()
		return err
	}
	return m.Deliver(f)
}

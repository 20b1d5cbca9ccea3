package simrun

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/kvtier/kvtier/tiers"
)

// delayer holds a tier's acks back for a random number of the rank's
// ticks (0..max), so the ranks of a group finish the same op at different
// ticks: the skew the frontier must absorb. Fault injection for the
// simulation, not a tier.
type delayer struct {
	now   *atomic.Uint64 // the rank's tick
	max   int
	mu    sync.Mutex
	rng   *rand.Rand
	held  []heldAck
	ready chan struct{}
	buf   []tiers.Ack
}

type heldAck struct {
	at  uint64
	ack tiers.Ack
}

func newDelayer(now *atomic.Uint64, max int, seed uint64, stream uint64) *delayer {
	return &delayer{now: now, max: max, rng: rand.New(rand.NewPCG(seed, stream)), ready: make(chan struct{}, 1)}
}

// drain moves inner's acks into the held list and returns the due ones.
func (d *delayer) drain(inner func([]tiers.Ack) []tiers.Ack, dst []tiers.Ack) []tiers.Ack {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.buf = inner(d.buf[:0])
	now := d.now.Load()
	for _, a := range d.buf {
		d.held = append(d.held, heldAck{at: now + uint64(d.rng.IntN(d.max+1)), ack: a})
	}
	keep := d.held[:0]
	for _, h := range d.held {
		if h.at <= now {
			dst = append(dst, h.ack)
		} else {
			keep = append(keep, h)
		}
	}
	d.held = keep
	return dst
}

// delayPool is a Pool whose acks a delayer holds back.
type delayPool struct {
	tiers.Pool
	d *delayer
}

func (p *delayPool) DrainAcks(dst []tiers.Ack) []tiers.Ack { return p.d.drain(p.Pool.DrainAcks, dst) }

// delayStore is a Store whose put acks a delayer holds back.
type delayStore struct {
	tiers.Store
	d *delayer
}

func (s *delayStore) DrainAcks(dst []tiers.Ack) []tiers.Ack { return s.d.drain(s.Store.DrainAcks, dst) }

package indexes

import (
	"sync/atomic"
	"time"
)

// CloseGate admits calls until Close and lets Close wait for the calls in
// flight; Index v1 implementations embed one. Unlike a RWMutex it never blocks a call while Close waits, so a
// call made from inside an Iterate callback cannot deadlock against a
// concurrent Close; it gets ErrClosed instead.
type CloseGate struct {
	inflight atomic.Int64
	closed   atomic.Bool
}

// Enter admits a call, or reports false once the gate is closed.
func (g *CloseGate) Enter() bool {
	g.inflight.Add(1)
	// NB: Close stores closed before it reads inflight and this call added
	// to inflight before it reads closed, so one of the two sees the other.
	if g.closed.Load() {
		g.inflight.Add(-1)
		return false
	}
	return true
}

// Exit ends a call that Enter admitted.
func (g *CloseGate) Exit() { g.inflight.Add(-1) }

// Close shuts the gate and waits until no admitted call is in flight. It
// reports false, without waiting, if the gate was already closed.
func (g *CloseGate) Close() bool {
	if !g.closed.CompareAndSwap(false, true) {
		return false
	}
	for d := time.Microsecond; g.inflight.Load() != 0; d = min(2*d, time.Millisecond) {
		time.Sleep(d)
	}
	return true
}

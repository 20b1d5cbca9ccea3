package tiers

import (
	"runtime"
	"sync"
)

// AckQueue holds a tier's acks (of Store Put items and Pool copy items)
// from the moment the tier queues them until the host drains them at a
// tick: it is what a Store's or Pool's DrainAcks drains. It is unbounded,
// because the contract lets neither side wait: a tier acks from its I/O
// goroutines, DrainAcks never blocks, and the host bounds the queue by
// draining it every tick. It is safe for concurrent use; the zero value is
// an empty queue.
type AckQueue struct {
	mu   sync.Mutex
	acks []Ack
}

// NewAckReady returns the channel a tier's AckReady returns and passes to
// AckQueue.Push: it buffers one signal, so Push never blocks and the
// signals of many pushes between two drains coalesce into one.
func NewAckReady() chan struct{} { return make(chan struct{}, 1) }

// Push appends acks in their order and then, if there were any, signals
// ready without blocking (a nil ready is never signalled). Acks pushed by
// one goroutine drain in the order it pushed them.
func (q *AckQueue) Push(ready chan<- struct{}, acks ...Ack) {
	if len(acks) == 0 {
		return
	}
	q.mu.Lock()
	q.acks = append(q.acks, acks...)
	q.mu.Unlock()
	// NB: signal after the acks are queued, so a host woken by ready
	// always finds them.
	select {
	case ready <- struct{}{}:
		// The woken host goroutine sits in this P's run-next slot: a
		// tier goroutine that goes on copying or checksumming a page
		// (milliseconds at 2.75 MiB) would keep it there, and an engine
		// step behind it, while the other P is busy. Hand it the P now.
		runtime.Gosched()
	default:
	}
}

// Drain appends every queued ack to dst in queue order, empties the queue
// and returns dst. The drained slots are cleared, so the queue's backing
// array does not keep their errors alive until it is overwritten.
func (q *AckQueue) Drain(dst []Ack) []Ack {
	q.mu.Lock()
	defer q.mu.Unlock()
	dst = append(dst, q.acks...)
	clear(q.acks)
	q.acks = q.acks[:0]
	return dst
}

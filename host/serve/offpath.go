package serve

import (
	"sync"
	"sync/atomic"
)

// offPath is a bounded queue from the step's path to one worker goroutine
// (the recorder's writer, the shadows' replayer): Send never blocks (a
// full queue drops the value and counts it) and is safe against Close.
type offPath[T any] struct {
	mu      sync.RWMutex // Send's send against Close's close
	closed  bool
	ch      chan T
	dropped atomic.Int64
}

func newOffPath[T any](size int) *offPath[T] { return &offPath[T]{ch: make(chan T, size)} }

// Send queues v unless the queue is full (counted) or closed (ignored).
func (q *offPath[T]) Send(v T) {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.closed {
		return
	}
	select {
	case q.ch <- v:
	default:
		q.dropped.Add(1)
	}
}

// Recv is the worker's end; it is closed by Close.
func (q *offPath[T]) Recv() <-chan T { return q.ch }

// Close closes the queue once; the worker drains what is queued.
func (q *offPath[T]) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.closed = true
		close(q.ch)
	}
}

// Dropped is the number of values dropped because the queue was full.
func (q *offPath[T]) Dropped() int64 { return q.dropped.Load() }

// Len is the number of values waiting.
func (q *offPath[T]) Len() int { return len(q.ch) }

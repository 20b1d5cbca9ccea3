package replay

import (
	"fmt"

	"github.com/kvtier/kvtier/host/radix"
)

// waitingQueue is the engine's waiting queue seen as an eviction hint:
// while request i is replayed, the requests i+1..i+N (N = the lookahead)
// wait, and the pages of theirs that are in the tree are protected from
// eviction.
//
// What is protected, exactly: the longest present prefix of every waiting
// request. When request j enters the window (as request j-N starts, or at
// the start of the replay for j < N), its present prefix is found with
// radix.Tree.PeekHashes (not a hit: no clock, no hit count, no recency)
// and the path's last node is locked with the tree's request lock, which
// keeps that node and every ancestor from being evicted. A locked prefix
// cannot shrink, and it grows only when a request inserts pages right
// below its last node; after each request's insert, the waiting requests
// locked at the new pages' parent are peeked again and their lock moved
// down to the new end of their prefix. The lock is released right after
// request j is replayed (its own request lock covers the same pages while
// it runs).
//
// Protection yields to the running request: when its pages do not fit
// even after every evictable leaf is gone, the window's locks are released
// from the furthest waiting request back towards the nearest, one at a
// time, evicting again after each, until the running request fits or no
// waiting request holds a lock. An engine must hold the running request's
// pages; a waiting request's pages are only a hint. A released request
// stays unprotected until it is replayed. Only a request longer than the
// capacity still inserts less than its whole input, as without lookahead.
//
// Cost per request: one PeekHashes and one Lock for the request entering
// the window, one Unlock for the one leaving it, a scan of the N slots
// when the request inserted pages, and a PeekHashes, Lock and Unlock per
// waiting request whose prefix grew; each tree call is linear in the
// path's nodes.
type waitingQueue struct {
	n int
	// held[j % (n+1)] is the node locked for request j: the root when
	// none of its pages is present (locking the root is a no-op), nil
	// when its lock was released.
	held []*radix.Node
	path []*radix.Node
	// yielded counts the locks released for a running request.
	yielded int64
}

func newWaitingQueue(n int) *waitingQueue {
	return &waitingQueue{n: n, held: make([]*radix.Node, n+1)}
}

// enter locks the present prefix of request j, if j is in the trace.
func (q *waitingQueue) enter(r *runner, j int) error {
	if j >= r.tr.Requests() {
		return nil
	}
	last, err := q.peek(r, j)
	if err != nil {
		return err
	}
	if err := r.tree.Lock(last); err != nil {
		return fmt.Errorf("lookahead: lock waiting request %d: %w", j+1, err)
	}
	q.held[j%(q.n+1)] = last
	return nil
}

// peek returns the last node of request j's present prefix, the root when
// none of it is present.
func (q *waitingQueue) peek(r *runner, j int) (*radix.Node, error) {
	keys, _, _ := r.tr.request(j)
	var pages int
	q.path, pages = r.tree.PeekHashes(keys, q.path)
	if pages == 0 {
		return r.tree.Root(), nil
	}
	return q.path[len(q.path)-1], nil
}

// leave releases request j's lock, if it holds one.
func (q *waitingQueue) leave(r *runner, j int) error {
	slot := j % (q.n + 1)
	n := q.held[slot]
	if n == nil {
		return nil
	}
	q.held[slot] = nil
	// NB: a locked node is never evicted or pruned, and a split keeps it
	// (it becomes the lower half, still ending at the same page), so the
	// node locked at entry is still live here.
	if err := r.tree.Unlock(n); err != nil {
		return fmt.Errorf("lookahead: unlock waiting request %d: %w", j+1, err)
	}
	return nil
}

// shed releases the lock of the furthest request after i that holds
// pages, and reports whether it released any.
func (q *waitingQueue) shed(r *runner, i int) (bool, error) {
	root := r.tree.Root()
	for j := min(i+q.n, r.tr.Requests()-1); j > i; j-- {
		if n := q.held[j%(q.n+1)]; n != nil && n != root {
			q.yielded++
			return true, q.leave(r, j)
		}
	}
	return false, nil
}

// grew moves down the locks of the requests after i whose present prefix
// ended at parent, under which request i has just inserted pages.
func (q *waitingQueue) grew(r *runner, i int, parent *radix.Node) error {
	for j := i + 1; j <= min(i+q.n, r.tr.Requests()-1); j++ {
		slot := j % (q.n + 1)
		if q.held[slot] != parent {
			continue
		}
		last, err := q.peek(r, j)
		if err != nil {
			return err
		}
		if last == parent {
			continue
		}
		// NB: lock the longer prefix before releasing the shorter, so
		// the shared pages never flap evictable.
		if err := r.tree.Lock(last); err != nil {
			return fmt.Errorf("lookahead: lock waiting request %d: %w", j+1, err)
		}
		if err := r.tree.Unlock(parent); err != nil {
			return fmt.Errorf("lookahead: unlock waiting request %d: %w", j+1, err)
		}
		q.held[slot] = last
	}
	return nil
}

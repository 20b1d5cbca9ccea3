package host

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

// The Store's puts, lookups, gets, deletes and touches run off the driver's
// goroutine: a step (or a replay's tick) never waits on L3, Redis or a
// plugin. The driver's goroutine queues a job (bounded); one worker
// goroutine, owned by the Node and started while jobs are queued, runs
// them in issue order under the Node's context (not the caller's: a call
// that issued a job may be long gone when it runs); Drain feeds the
// results back to the Machine as local facts (Longest, Done(loaded)),
// which become replicated only through the tick frontier, as acks do.
// StoreReady is signalled when a result is waiting.

// defaultStoreQueue bounds the jobs issued and not yet drained.
const defaultStoreQueue = 1024

// ErrStoreQueueFull is why a store operation failed at once: the Node's
// worker has Options.StoreQueue jobs not yet answered (a slow or stuck
// tier). The op misses or fails; the step never waits.
var ErrStoreQueueFull = errors.New("host: store queue full")

type jobKind uint8

const (
	jobLookup jobKind = iota + 1
	jobGet
	jobDelete
	jobTouch
	jobPut
)

func (k jobKind) String() string {
	switch k {
	case jobLookup:
		return "lookup"
	case jobGet:
		return "get"
	case jobDelete:
		return "delete"
	case jobTouch:
		return "touch"
	case jobPut:
		return "put"
	}
	return "unknown"
}

// storeJob is one Store call run by the worker. The worker writes only
// the result fields; the driver reads them after Drain takes the job.
type storeJob struct {
	seq  uint64
	kind jobKind
	op   control.OpID
	ctx  context.Context

	// lookup: the owned hashes, their positions in the lookup's key (nil:
	// every page is this lane's) and the key's length.
	hashes []pagehash.Hash
	pos    []int
	total  int
	// get
	gets []tiers.GetRequest
	// delete, touch
	keys []tiers.Key
	// put: the items, their sizes and the batch id Put returned
	puts  []tiers.PutRequest
	sizes []int64
	batch tiers.BatchID

	// results
	pages int   // lookup: pages covered
	ok    bool  // get: every item a verified hit
	bytes int64 // get: bytes reloaded
	err   error // the first error
}

// enqueue hands j to the worker, or reports false when the queue is full
// or the Node is closed (the caller fails the op at once).
func (n *Node) enqueue(j *storeJob) bool {
	if n.closed || len(n.jobs) >= n.opts.StoreQueue {
		return false
	}
	n.nextJob++
	j.seq, j.ctx = n.nextJob, n.jobCtx
	n.jobs[j.seq] = j
	if j.kind == jobPut {
		n.putJobs++
	}
	n.jobMu.Lock()
	n.jobQ = append(n.jobQ, j)
	if !n.jobRunning {
		n.jobRunning = true
		n.jobWG.Add(1)
		go n.work()
	}
	n.jobMu.Unlock()
	return true
}

// work runs queued jobs in order until none is left.
func (n *Node) work() {
	defer n.jobWG.Done()
	for {
		n.jobMu.Lock()
		if len(n.jobQ) == 0 {
			n.jobRunning = false
			n.jobMu.Unlock()
			return
		}
		j := n.jobQ[0]
		n.jobQ[0] = nil
		n.jobQ = n.jobQ[1:]
		n.jobMu.Unlock()
		n.exec(j)
		n.jobMu.Lock()
		n.jobDone = append(n.jobDone, j)
		n.jobMu.Unlock()
		select {
		case n.jobReady <- struct{}{}:
			// The rank goroutine just woken sits in this P's run-next
			// slot; the next job (a reload's copies, milliseconds) would
			// keep it, and a step behind it, waiting. Yield to it.
			runtime.Gosched()
		default:
		}
	}
}

// exec makes j's Store call. It touches only j and the store.
func (n *Node) exec(j *storeJob) {
	if err := j.ctx.Err(); err != nil {
		j.err = fmt.Errorf("%s abandoned before it ran: %w", j.kind, err)
		return
	}
	switch j.kind {
	case jobLookup:
		j.pages = j.total
		for k := range n.kinds {
			got, err := n.store.LongestPrefix(j.ctx, tiers.PayloadKind(k), j.hashes)
			if err != nil {
				j.err = err
				got = 0
			}
			got = max(0, min(got, len(j.hashes)))
			if j.pos != nil {
				got = j.pos[got] // a position in the key (see the sentinel)
			}
			j.pages = min(j.pages, got)
		}
	case jobGet:
		res := make([]error, len(j.gets))
		j.ok = true
		if err := n.store.Get(j.ctx, j.gets, res); err != nil {
			j.ok, j.err = false, err
			return
		}
		for i, e := range res {
			if e != nil {
				j.ok = false
				if j.err == nil {
					j.err = e
				}
			} else {
				j.bytes += j.gets[i].Dst.Length
			}
		}
	case jobDelete:
		j.err = n.store.Delete(j.ctx, j.keys)
	case jobTouch:
		j.err = n.store.Touch(j.ctx, j.keys)
	case jobPut:
		j.batch, j.err = n.store.Put(j.ctx, j.puts)
		if j.err == nil && j.batch == 0 {
			j.err = fmt.Errorf("the store returned batch 0")
		}
	}
}

// drainJobs feeds the finished jobs' results to the Machine. A result
// whose job was abandoned (Settle's timeout or cancel, Close) is ignored.
func (n *Node) drainJobs() {
	n.jobMu.Lock()
	done := n.jobDone
	n.jobDone = n.jobSpare[:0]
	n.jobMu.Unlock()
	for i, j := range done {
		done[i] = nil
		if n.jobs[j.seq] != j {
			continue
		}
		delete(n.jobs, j.seq)
		if j.kind == jobPut {
			n.putJobs--
		}
		n.finish(j)
	}
	n.jobSpare = done[:0]
}

func (n *Node) finish(j *storeJob) {
	switch j.kind {
	case jobLookup:
		if j.err != nil {
			n.stats.FailedOps["lookup"]++
			n.log.Warn("kvtier host: lookup", "op", uint64(j.op), "err", j.err)
		}
		if err := n.facts.Longest(j.op, j.pages); err != nil {
			n.log.Error("kvtier host: longest", "op", uint64(j.op), "err", err)
		}
	case jobGet:
		if j.ok {
			n.stats.L3ToL2 += j.bytes
		} else {
			n.stats.FailedOps["get"]++
			n.log.Warn("kvtier host: get", "op", uint64(j.op), "err", j.err)
		}
		n.done(j.op, control.StageLoaded, j.ok)
	case jobDelete:
		if j.err != nil {
			n.log.Warn("kvtier host: delete after a failed spill", "err", j.err)
		}
	case jobTouch:
		if j.err != nil {
			n.log.Debug("kvtier host: touch", "err", j.err)
		}
	case jobPut:
		if j.err != nil {
			n.log.Warn("kvtier host: put refused", "op", uint64(j.op), "err", j.err)
			n.fail(j.op, "put", control.StageGathered, control.StageDurable)
			return
		}
		b := &batch{op: j.op, kind: "put", bytes: j.sizes, state: make([]uint8, len(j.puts))}
		if !n.storeKeepsSums {
			for i, r := range j.puts {
				if !r.HasSum {
					continue
				}
				if b.sums == nil {
					b.sums = make([]putSum, len(j.puts))
				}
				b.sums[i] = putSum{span: r.Src, sum: r.Sum, has: true}
			}
		}
		n.puts[j.batch] = b
	}
}

// refuse answers a job the queue did not take: a lookup finds nothing, a
// get or put fails; a delete or touch is dropped (the store's own GC reclaims an
// undeleted page; a touch is advice).
func (n *Node) refuse(j *storeJob, why error) {
	j.err = why
	j.pages, j.ok = 0, false
	n.finish(j)
}

// abandonJobs fails every job not yet drained: a lookup finds nothing, a
// get or put fails. Their late results are ignored, and the worker's context is
// canceled so a tier that honours it stops early.
func (n *Node) abandonJobs(why string) {
	n.putJobs = 0
	for seq, j := range n.jobs {
		delete(n.jobs, seq)
		switch j.kind {
		case jobLookup:
			n.log.Warn("kvtier host: store operation abandoned", "op", uint64(j.op), "kind", j.kind.String(), "why", why)
			n.stats.FailedOps["timeout"]++
			if err := n.facts.Longest(j.op, 0); err != nil {
				n.log.Error("kvtier host: longest", "op", uint64(j.op), "err", err)
			}
		case jobGet:
			n.log.Warn("kvtier host: store operation abandoned", "op", uint64(j.op), "kind", j.kind.String(), "why", why)
			n.stats.FailedOps["timeout"]++
			n.done(j.op, control.StageLoaded, false)
		case jobPut:
			n.log.Warn("kvtier host: store operation abandoned", "op", uint64(j.op), "kind", j.kind.String(), "why", why)
			n.stats.FailedOps["timeout"]++
			n.done(j.op, control.StageGathered, false)
			n.done(j.op, control.StageDurable, false)
		}
	}
	n.jobCancel()
	n.jobCtx, n.jobCancel = context.WithCancel(context.Background())
}

// StoreReady returns a channel that receives a value whenever a store
// operation's result waits for Drain (select on it beside the tiers'
// AckReady).
func (n *Node) StoreReady() <-chan struct{} { return n.jobReady }

// Close abandons the store operations still queued or running (their ops
// fail, as in Settle's timeout) and waits, at most SettleTimeout, for the
// worker to return, so that no Get still writes a slab span a later
// Machine reuses. Close must be called from the owner goroutine; the Node
// issues no store operation after it.
func (n *Node) Close() error {
	if n.closed {
		return nil
	}
	n.closed = true
	n.abandonJobs("closed")
	done := make(chan struct{})
	go func() {
		n.jobWG.Wait()
		close(done)
	}()
	t := time.NewTimer(n.opts.SettleTimeout)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		return fmt.Errorf("host: a store operation still runs %v after Close", n.opts.SettleTimeout)
	}
}

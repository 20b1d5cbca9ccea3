package redis

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/tiers"
)

// ErrNotReplicated is the error of a put item whose master confirmed it but
// fewer than min_replicas replicas did within replica_timeout.
var ErrNotReplicated = errors.New("not confirmed by enough replicas")

// errRaced marks a put whose APPEND found a value of the wrong length.
var errRaced = errors.New("another put of the same page ran between SET and APPEND")

// putSenders is the number of chunks in flight to the servers at once: with
// two, one chunk's replies are read while the next one is written, so the
// server never waits for the client between chunks.
const putSenders = 2

// putJob is one accepted Put batch.
type putJob struct {
	id   tiers.BatchID
	reqs []tiers.PutRequest
	srcs [][]byte
}

// putChunk is up to pipeline_depth items of one job. The payloads are
// still in the slab and are sent from there.
type putChunk struct {
	id    tiers.BatchID
	index []int // item index within the batch
	keys  []tiers.Key
	srcs  [][]byte // the payloads, in the slab
	crcs  []*pageCRC
}

// Put accepts the batch and returns at once; the gatherer and the sender
// acknowledge its items.
func (s *Store) Put(_ context.Context, batch []tiers.PutRequest) (tiers.BatchID, error) {
	srcs := make([][]byte, len(batch))
	for i, r := range batch {
		b, err := s.span(r.Key, r.Src)
		if err != nil {
			return 0, fmt.Errorf("redis put item %d: %w", i, err)
		}
		srcs[i] = b
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return 0, tiers.ErrClosed
	}
	if len(batch) == 0 {
		return 0, nil
	}
	job := &putJob{id: tiers.BatchID(s.nextID.Add(1)), reqs: append([]tiers.PutRequest(nil), batch...), srcs: srcs}
	s.puts.Add(int64(len(batch)))
	s.pendMu.Lock()
	s.pending = append(s.pending, job)
	s.pendMu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return job.id, nil
}

// KeepsPutSums implements tiers.SumKeeper: a put with a sum sends it in
// the value's trailer as given.
func (s *Store) KeepsPutSums() bool { return true }

// gatherLoop cuts accepted batches into chunks of pipeline_depth items and
// hands them to the senders; the payloads stay in the slab. On stop it
// fails every item not yet handed over with ErrClosed.
func (s *Store) gatherLoop() {
	defer s.done.Done()
	defer close(s.chunks)
	for {
		s.pendMu.Lock()
		var job *putJob
		if len(s.pending) > 0 {
			job = s.pending[0]
			s.pending[0] = nil
			s.pending = s.pending[1:]
		}
		s.pendMu.Unlock()
		if job == nil {
			select {
			case <-s.wake:
				continue
			case <-s.stop:
				s.failPending()
				return
			}
		}
		depth := s.cfg.PipelineDepth
		for start := 0; start < len(job.reqs); start += depth {
			select {
			case <-s.stop:
				s.failItems(job.id, start, len(job.reqs), tiers.ErrClosed)
				s.failPending()
				return
			default:
			}
			end := min(start+depth, len(job.reqs))
			c := &putChunk{id: job.id}
			for i := start; i < end; i++ {
				r := job.reqs[i]
				c.index = append(c.index, i)
				c.keys = append(c.keys, r.Key)
				c.srcs = append(c.srcs, job.srcs[i])
				if r.HasSum {
					c.crcs = append(c.crcs, givenPageCRC(r.Key, job.srcs[i], r.Sum))
				} else {
					c.crcs = append(c.crcs, newPageCRC(r.Key, job.srcs[i]))
				}
				job.srcs[i] = nil
			}
			s.chunks <- c
		}
	}
}

// failPending fails every item of every job not yet started.
func (s *Store) failPending() {
	s.pendMu.Lock()
	jobs := s.pending
	s.pending = nil
	s.pendMu.Unlock()
	for _, j := range jobs {
		s.failItems(j.id, 0, len(j.reqs), tiers.ErrClosed)
	}
}

func (s *Store) failItems(id tiers.BatchID, from, to int, err error) {
	acks := make([]tiers.Ack, 0, to-from)
	for i := from; i < to; i++ {
		acks = append(acks, tiers.Ack{Batch: id, Index: i, Stage: tiers.AckFailed, Err: err})
	}
	s.putFailures.Add(int64(to - from))
	s.acks.Push(s.ready, acks...)
}

// sendLoop writes chunks and acknowledges their items gathered and durable,
// or failed. The payloads go from the slab to the socket with no copy in
// between, so an item is gathered (its span free for the host) only once
// its round trip is over: the bytes are then in the server, or the item
// failed, and no retry will read the span again. It drains every chunk the
// gatherer made, even after Close began: those items are in flight and
// Close waits for them.
func (s *Store) sendLoop() {
	defer s.done.Done()
	for c := range s.chunks {
		errs := s.send(c)
		acks := make([]tiers.Ack, 0, 2*len(c.keys))
		failed := 0
		for j := range c.keys {
			if errs[j] != nil {
				acks = append(acks, tiers.Ack{Batch: c.id, Index: c.index[j], Stage: tiers.AckFailed, Err: errs[j]})
				failed++
				continue
			}
			acks = append(acks,
				tiers.Ack{Batch: c.id, Index: c.index[j], Stage: tiers.AckGathered},
				tiers.Ack{Batch: c.id, Index: c.index[j], Stage: tiers.AckDurable})
			s.pages.Add(1)
			s.bytes.Add(int64(len(c.srcs[j])))
		}
		c.srcs, c.crcs = nil, nil
		if failed > 0 {
			s.refreshSlots()
			s.putFailures.Add(int64(failed))
			s.logRate(logPut, "redis puts failed", "failed", failed, "of", len(c.keys), "first_error", firstErr(errs))
		}
		s.acks.Push(s.ready, acks...)
	}
}

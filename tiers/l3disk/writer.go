package l3disk

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/internal/invariants"
	"github.com/kvtier/kvtier/tiers"
)

// writerLoop owns the slot pools, the LRU and GC.
func (s *Store) writerLoop() {
	defer s.writerWG.Done()
	defer close(s.ioJobs)
	gathered := s.gathered
	for gathered != nil || s.inflightN > 0 {
		select {
		case job, ok := <-gathered:
			if !ok {
				gathered = nil
				continue
			}
			s.handleCtl()
			s.handleGathered(job)
		case res := <-s.commits:
			s.handleCommits(res)
		case <-s.ctlSig:
			s.handleCtl()
		}
		if invariants.Enabled {
			s.checkPools()
		}
	}
	s.handleCtl()
}

// checkPools panics with the violation if a slot pool's invariants are
// broken (invariant builds only: it is O(slots) per writer step).
func (s *Store) checkPools() {
	for k, p := range s.pools {
		if err := p.check(); err != nil {
			panic(fmt.Sprintf("l3disk: slot pool of kind %d: %v", k, err))
		}
		if got := s.st.usedSlots[k].Load(); got != int64(p.used()) {
			panic(fmt.Sprintf("l3disk: kind %d used-slots counter %d, pool says %d", k, got, p.used()))
		}
	}
}

func (s *Store) releaseStaging(job *writeJob) {
	if job.buf != nil {
		s.staging <- job.buf
		job.buf = nil
	}
}

// gatheredNow sends a direct job's own AckGathered when the job ends
// without its write (a duplicate of a page in flight or stored): its span
// is not read any more.
func (s *Store) gatheredNow(job *writeJob) {
	if job.direct {
		s.ack(tiers.Ack{Batch: job.own.batch, Index: job.own.index, Stage: tiers.AckGathered})
	}
}

func (s *Store) handleGathered(job *writeJob) {
	k := job.key.Kind
	f, pool := s.files[k], s.pools[k]
	if err := f.readOnlyErr(); err != nil {
		s.releaseStaging(job)
		s.failItems(job.items, fmt.Errorf("l3disk put %s: %w: %w", job.key, tiers.ErrBroken, err))
		return
	}
	if slot, ok := pool.lookup(job.key.Hash); ok {
		switch {
		case pool.state[slot] == slotInFlight:
			s.releaseStaging(job)
			s.gatheredNow(job)
			s.st.dedups.Add(int64(len(job.items)))
			other := s.inflight[job.key]
			other.items = append(other.items, job.items...)
			return
		case s.indexNames(job.key, slot) && s.verifyLive(job.key, slot):
			s.releaseStaging(job)
			s.gatheredNow(job)
			s.st.dedups.Add(int64(len(job.items)))
			pool.touch(slot, s.clock.Add(1))
			s.ackDurable(job.items)
			return
		default:
			// NB: a reader dropped this page's entry (its slot failed
			// verification) and its notice has not reached us yet: a
			// durable ack now would be a lie. Free the slot and write
			// the page again.
			s.freeLive(k, slot)
		}
	}
	s.collect(k)
	slot, ok := pool.alloc(job.key.Hash)
	if !ok {
		s.releaseStaging(job)
		s.failItems(job.items, fmt.Errorf("l3disk put %s: all %d slots of kind %d are in use or in flight: %w", job.key, pool.size(), k, tiers.ErrFull))
		return
	}
	s.st.usedSlots[k].Add(1)
	job.slot = slot
	s.inflight[job.key] = job
	s.inflightN++
	for {
		select {
		case s.ioJobs <- job:
			return
		case res := <-s.commits:
			s.handleCommits(res)
		}
	}
}

// verifyLive reports whether a live slot's payload verifies, reading it
// once per open: a slot adopted by a cold-start load had only its header
// checked, and acking a put durable against a rotten payload would be a
// lie. A slot that fails loses its index entry (the caller then frees it
// and writes the page again).
func (s *Store) verifyLive(key tiers.Key, slot int32) bool {
	k := key.Kind
	if s.verified[k][slot] {
		return true
	}
	f := s.files[k]
	buf := <-s.readBufs
	defer func() { s.readBufs <- buf }()
	err := f.readSlot(int64(slot), buf.Bytes())
	if err == nil {
		_, err = verifySlot(buf.Bytes(), uint8(k), f.epoch(), key.Hash, s.pageBytes[k], f.version())
	}
	if err == nil {
		s.verified[k][slot] = true
		return true
	}
	s.st.corrupt.Add(1)
	s.limiter.Warn("dedup-verify", "l3 put: live slot failed verification; writing the page again", "key", key.String(), "slot", slot, "path", f.path, "err", err)
	e := []indexes.Entry{{Key: key.IndexKey(), Record: s.record(k, slot, 0)}}
	if derr := s.index.DeleteIf(context.Background(), e, make([]bool, 1)); derr != nil {
		s.st.indexErrors.Add(1)
	}
	return false
}

// indexNames reports whether the index maps key to this store's slot
// (an index error counts as no: the caller then rewrites the page).
func (s *Store) indexNames(key tiers.Key, slot int32) bool {
	recs, found := make([]indexes.Record, 1), make([]bool, 1)
	if err := s.index.Get(context.Background(), []indexes.Key{key.IndexKey()}, recs, found); err != nil {
		s.st.indexErrors.Add(1)
		return false
	}
	r := recs[0]
	return found[0] && int(r.Disk) == s.disk && r.Slot == uint64(slot) && r.Epoch == s.files[key.Kind].epoch()
}

func (s *Store) ackDurable(items []putItem) {
	acks := make([]tiers.Ack, len(items))
	for i, it := range items {
		acks[i] = tiers.Ack{Batch: it.batch, Index: it.index, Stage: tiers.AckDurable}
	}
	s.st.puts.Add(int64(len(items)))
	s.ack(acks...)
}

func (s *Store) record(k tiers.PayloadKind, slot int32, at uint64) indexes.Record {
	return indexes.Record{Disk: uint16(s.disk), Kind: uint8(k), Slot: uint64(slot), Epoch: s.files[k].epoch(), LastAccess: at}
}

func (s *Store) handleCommits(jobs []*writeJob) {
	for _, job := range jobs {
		k := job.key.Kind
		pool := s.pools[k]
		s.inflightN--
		delete(s.inflight, job.key)
		if job.err != nil {
			if errors.Is(job.err, indexes.ErrFull) && s.indexCap[k] != pool.used() {
				s.indexCap[k] = pool.used()
				s.st.indexFullCaps.Add(1)
			}
			pool.abort(job.slot)
			s.st.usedSlots[k].Add(-1)
			s.failItems(job.items, job.err)
		} else {
			pool.commit(job.slot, s.clock.Add(1))
			s.verified[k][job.slot] = true
			s.st.livePages.Add(1)
			s.st.liveBytes.Add(s.pageBytes[k])
			s.st.spillBytes.Add(s.pageBytes[k])
			if job.dropped {
				// A reader found the fresh slot failing verification and
				// removed its index entry: the page is not stored.
				s.freeLive(k, job.slot)
				s.failItems(job.items, fmt.Errorf("l3disk put %s: slot %d failed verification right after its write: %w", job.key, job.slot, ErrPayloadCorrupt))
			} else {
				s.ackDurable(job.items)
			}
		}
		for _, d := range job.deletes {
			if job.err == nil && !job.dropped {
				if err := s.deleteLive([]tiers.Key{job.key}); err != nil {
					d.err = errors.Join(d.err, err)
				}
			}
			d.pending--
			if d.pending == 0 {
				d.done <- d.err
			}
		}
	}
}

// freeLive releases a live slot whose index entry is gone.
func (s *Store) freeLive(k tiers.PayloadKind, slot int32) {
	s.pools[k].release(slot)
	s.verified[k][slot] = false
	s.st.usedSlots[k].Add(-1)
	s.st.livePages.Add(-1)
	s.st.liveBytes.Add(-s.pageBytes[k])
}

package l3disk

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/internal/bgprio"
	"github.com/kvtier/kvtier/tiers"
)

// getLoop runs jobs of Get (its slot reads, or its checks and copies
// out: work a serve step should not wait behind) on a background thread
// until the store stops.
func (s *Store) getLoop(jobs <-chan func()) {
	defer s.checkWG.Done()
	defer bgprio.Lower()()
	for {
		select {
		case f := <-jobs:
			f()
		case <-s.stop:
			return
		}
	}
}

// ioLoop writes slots.
func (s *Store) ioLoop() {
	defer s.ioWG.Done()
	defer bgprio.Lower()()
	for job := range s.ioJobs {
		f := s.files[job.key.Kind]
		var err error
		if job.direct {
			err = f.writeSlotv(int64(job.slot), job.buf.Bytes(), job.own.src)
			// The span is not read any more, whatever the write did; a
			// failure follows as the item's AckFailed.
			s.ack(tiers.Ack{Batch: job.own.batch, Index: job.own.index, Stage: tiers.AckGathered})
			if err == nil {
				s.st.directWrites.Add(1)
			}
		} else {
			err = f.writeSlot(int64(job.slot), job.buf.Bytes())
		}
		if err != nil {
			s.st.writeErrors.Add(1)
			job.err = fmt.Errorf("l3disk put %s: %w", job.key, err)
			s.limiter.Error("write", "l3 slot write failed", "key", job.key.String(), "slot", job.slot, "path", f.path, "err", err)
		}
		s.releaseStaging(job)
		s.written <- job
	}
}

// maxSyncGroup bounds the writes made durable by one fdatasync and one
// index commit.
const maxSyncGroup = 1024

// syncLoop makes groups of written slots durable, then indexes them:
// data -> fdatasync -> index commit.
func (s *Store) syncLoop() {
	defer s.syncWG.Done()
	defer bgprio.Lower()()
	group := make([]*writeJob, 0, maxSyncGroup)
	for {
		job, ok := <-s.written
		if !ok {
			return
		}
		group = append(group[:0], job)
	drain:
		for len(group) < cap(group) {
			select {
			case j, ok := <-s.written:
				if !ok {
					break drain
				}
				group = append(group, j)
			default:
				break drain
			}
		}
		s.commitGroup(group)
		out := make([]*writeJob, len(group))
		copy(out, group)
		s.commits <- out
	}
}

func (s *Store) commitGroup(group []*writeJob) {
	synced := make([]bool, len(s.files))
	syncErr := make([]error, len(s.files))
	for _, j := range group {
		k := j.key.Kind
		if j.err != nil || synced[k] {
			continue
		}
		synced[k] = true
		f := s.files[k]
		if err := f.readOnlyErr(); err != nil {
			syncErr[k] = err
			continue
		}
		if err := f.sync(); err != nil {
			// NB: never retry: after EIO the kernel may have dropped
			// the dirty pages and cleared the error, so a second fsync
			// could "succeed" over lost data. The slab goes read-only.
			if f.markReadOnly(err) {
				s.log.Error("l3 fdatasync failed; slab is read-only for the rest of this run", "path", f.path, "err", err)
			}
			syncErr[k] = f.readOnlyErr()
		}
	}
	for k, done := range synced {
		if done && syncErr[k] == nil {
			s.st.syncs.Add(1)
		}
	}
	entries := make([]indexes.Entry, 0, len(group))
	at := s.clock.Load()
	for _, j := range group {
		if j.err != nil {
			continue
		}
		if err := syncErr[j.key.Kind]; err != nil {
			j.err = fmt.Errorf("l3disk put %s: %w: %w", j.key, tiers.ErrBroken, err)
			continue
		}
		entries = append(entries, indexes.Entry{Key: j.key.IndexKey(), Record: s.record(j.key.Kind, j.slot, at)})
	}
	s.st.syncedWrites.Add(int64(len(entries)))
	if len(entries) == 0 {
		return
	}
	if err := s.index.Put(context.Background(), entries); err != nil {
		s.st.indexErrors.Add(1)
		s.limiter.Error("put-index", "l3 index commit failed; pages not stored", "pages", len(entries), "err", err)
		for _, j := range group {
			if j.err == nil {
				j.err = fmt.Errorf("l3disk put %s: index: %w", j.key, err)
				if errors.Is(err, indexes.ErrFull) {
					j.err = fmt.Errorf("l3disk put %s: %w: %w", j.key, tiers.ErrFull, err)
				}
			}
		}
	}
}

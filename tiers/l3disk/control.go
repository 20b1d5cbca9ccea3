package l3disk

import (
	"context"
	"fmt"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/tiers"
)

func (s *Store) postCtl(op ctlOp) {
	s.ctlMu.Lock()
	s.ctlQ = append(s.ctlQ, op)
	s.ctlMu.Unlock()
	signal(s.ctlSig)
}

func (s *Store) handleCtl() {
	s.ctlMu.Lock()
	ops := s.ctlQ
	s.ctlQ = nil
	s.ctlMu.Unlock()
	var touched []indexes.Key
	for _, op := range ops {
		switch op.kind {
		case ctlTouch:
			for _, key := range op.keys {
				pool := s.pools[key.Kind]
				if slot, ok := pool.lookup(key.Hash); ok && pool.state[slot] == slotLive {
					pool.touch(slot, s.clock.Add(1))
					touched = append(touched, key.IndexKey())
				}
			}
		case ctlDelete:
			var live []tiers.Key
			for _, key := range op.keys {
				if job, ok := s.inflight[key]; ok {
					job.deletes = append(job.deletes, op.del)
					op.del.pending++
					continue
				}
				live = append(live, key)
			}
			if err := s.deleteLive(live); err != nil {
				op.del.err = err
			}
			if op.del.pending == 0 {
				op.del.done <- op.del.err
			}
		case ctlCall:
			op.fn()
		case ctlCorrupt:
			pool := s.pools[op.key.Kind]
			slot, ok := pool.lookup(op.key.Hash)
			if !ok || uint64(slot) != op.rec.Slot || op.rec.Epoch != s.files[op.key.Kind].epoch() {
				continue
			}
			switch pool.state[slot] {
			case slotLive:
				s.freeLive(op.key.Kind, slot)
			case slotInFlight:
				s.inflight[op.key].dropped = true
			}
		}
	}
	if len(touched) > 0 {
		if err := s.index.Touch(context.Background(), touched, s.clock.Load()); err != nil {
			s.st.indexErrors.Add(1)
			s.limiter.Warn("touch-index", "l3 touch: index update failed (the in-memory LRU is updated)", "keys", len(touched), "err", err)
		}
	}
}

// Delete implements tiers.Store. Keys being written are deleted once
// their write lands, before Delete returns.
func (s *Store) Delete(ctx context.Context, keys []tiers.Key) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	for _, k := range keys {
		if _, err := s.kindBytes(k.Kind); err != nil {
			return fmt.Errorf("l3disk delete %s: %w", k, err)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	d := &deleteOp{done: make(chan error, 1)}
	s.postCtl(ctlOp{kind: ctlDelete, keys: append([]tiers.Key(nil), keys...), del: d})
	select {
	case err := <-d.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("l3disk delete: %w", ctx.Err())
	}
}

// Touch implements tiers.Store. It is asynchronous: the writer applies it
// before its next put.
func (s *Store) Touch(_ context.Context, keys []tiers.Key) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	for _, k := range keys {
		if _, err := s.kindBytes(k.Kind); err != nil {
			return fmt.Errorf("l3disk touch %s: %w", k, err)
		}
	}
	if len(keys) > 0 {
		s.postCtl(ctlOp{kind: ctlTouch, keys: append([]tiers.Key(nil), keys...)})
	}
	return nil
}

// Stats implements tiers.Store.
func (s *Store) Stats() tiers.StoreStats {
	var capacity int64
	for k, f := range s.files {
		capacity += f.sb.Slots * s.pageBytes[k]
	}
	return tiers.StoreStats{
		Pages: s.st.livePages.Load(), Bytes: s.st.liveBytes.Load(), CapacityBytes: capacity,
		Hits: s.st.hits.Load(), Misses: s.st.misses.Load(), Corrupt: s.st.corrupt.Load(),
		Puts: s.st.puts.Load(), PutFailures: s.st.putFailures.Load(), Evictions: s.st.evicted.Load(),
	}
}

// Close implements tiers.Store: queued puts fail with ErrClosed, puts
// already gathered are written and acknowledged, then files close.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return fmt.Errorf("l3disk close: %w", tiers.ErrClosed)
	}
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	s.bgCancel()
	s.bgWG.Wait()
	close(s.stop)
	s.gatherWG.Wait()
	s.checkWG.Wait()
	s.writerWG.Wait()
	s.ioWG.Wait()
	close(s.written)
	s.syncWG.Wait()
	// The writer exits only with nothing in flight; commits is empty.
	return s.release()
}

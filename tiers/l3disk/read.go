package l3disk

import (
	"context"
	"fmt"
	"sync"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
)

// miss returns a per-item miss result.
func miss(key tiers.Key, why string, cause error) error {
	if cause != nil {
		return fmt.Errorf("l3disk get %s: %s: %w: %w", key, why, tiers.ErrMiss, cause)
	}
	return fmt.Errorf("l3disk get %s: %s: %w", key, why, tiers.ErrMiss)
}

// Get implements tiers.Store.
func (s *Store) Get(ctx context.Context, batch []tiers.GetRequest, results []error) error {
	if len(results) != len(batch) {
		return fmt.Errorf("l3disk get: %d results for %d requests: %w", len(results), len(batch), tiers.ErrInvalid)
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	dsts := make([][]byte, len(batch))
	keys := make([]indexes.Key, len(batch))
	for i, r := range batch {
		b, err := s.spanBytes(r.Key, r.Dst)
		if err != nil {
			return fmt.Errorf("l3disk get item %d: %w", i, err)
		}
		dsts[i], keys[i] = b, r.Key.IndexKey()
		batch[i].Sum, batch[i].HasSum = 0, false // outputs: set on a hit
	}
	recs := make([]indexes.Record, len(batch))
	found := make([]bool, len(batch))
	if err := s.index.Get(ctx, keys, recs, found); err != nil {
		s.st.indexErrors.Add(1)
		return fmt.Errorf("l3disk get %d keys: index: %w: %w", len(keys), tiers.ErrBroken, err)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		drop []indexes.Entry
	)
	dropEntry := func(i int) {
		mu.Lock()
		drop = append(drop, indexes.Entry{Key: keys[i], Record: recs[i]})
		mu.Unlock()
	}
	for i, r := range batch {
		rec := recs[i]
		k := r.Key.Kind
		switch {
		case !found[i]:
			results[i] = miss(r.Key, "not found", nil)
			continue
		case rec.Kind != uint8(k) || int(rec.Disk) != s.disk || epochRank(rec.Epoch) != s.rank:
			// Another rank's or disk's page (a shared index): not ours
			// to read or to drop.
			results[i] = miss(r.Key, fmt.Sprintf("indexed on disk %d rank %d, this store is disk %d rank %d", rec.Disk, epochRank(rec.Epoch), s.disk, s.rank), nil)
			continue
		case rec.Epoch != s.files[k].epoch():
			results[i] = miss(r.Key, fmt.Sprintf("stale epoch %#x (current %#x)", rec.Epoch, s.files[k].epoch()), nil)
			s.st.staleDropped.Add(1)
			dropEntry(i)
			continue
		case rec.Slot >= uint64(s.files[k].sb.Slots):
			results[i] = miss(r.Key, fmt.Sprintf("slot %d out of range [0, %d)", rec.Slot, s.files[k].sb.Slots), ErrSlotMismatch)
			s.st.corrupt.Add(1)
			dropEntry(i)
			continue
		}
		var buf *diskfs.AlignedBuffer
		select {
		case buf = <-s.readBufs:
		case <-ctx.Done():
			results[i] = miss(r.Key, "cancelled", ctx.Err())
			continue
		}
		wg.Add(1)
		go func(i int, buf *diskfs.AlignedBuffer) {
			defer wg.Done()
			defer func() { s.readBufs <- buf }()
			f := s.files[k]
			// NB: a payload of whole blocks in a block-aligned span is
			// read straight into the caller's span (GetRequest.Dst is
			// unspecified on a miss); the staging buffer takes the header
			// block only, and the check is one read pass over the span.
			direct := s.zeroCopy && f.blockPayload() && diskfs.Aligned(dsts[i])
			// NB: the read runs on one of the store's Depth readers (on
			// background threads, as the checks): the kernel's share of
			// an O_DIRECT read is CPU a serve step should not wait behind.
			var err error
			read := make(chan struct{})
			s.reads <- func() {
				defer close(read)
				if direct {
					err = f.readSlotv(int64(rec.Slot), buf.Bytes(), dsts[i])
				} else {
					err = f.readSlot(int64(rec.Slot), buf.Bytes())
				}
			}
			<-read
			if err != nil {
				s.st.readErrors.Add(1)
				s.st.corrupt.Add(1)
				s.limiter.Error("read", "l3 slot read failed", "key", r.Key.String(), "slot", rec.Slot, "path", f.path, "err", err)
				results[i] = miss(r.Key, fmt.Sprintf("slot %d of %s unreadable", rec.Slot, f.path), err)
				dropEntry(i)
				return
			}
			// NB: the check and the copy out are up to MiBs of CPU work
			// a page; they run on the store's checkers (CPUs-1 of them,
			// on background threads: internal/bgprio), so a batch of
			// reads never takes every core from the callers (a serve
			// step's goroutines).
			done := make(chan struct{})
			var sum uint32
			s.checks <- func() {
				defer close(done)
				if direct {
					sum, err = verifyInPlace(buf.Bytes(), dsts[i], uint8(k), rec.Epoch, r.Key.Hash, f.version())
					return
				}
				// One pass: the copy out and the check of what it copied.
				sum, err = copyVerifiedSlot(dsts[i], buf.Bytes(), uint8(k), rec.Epoch, r.Key.Hash, s.pageBytes[k], f.version())
			}
			<-done
			if err == nil {
				batch[i].Sum, batch[i].HasSum = sum, true
				if direct {
					s.st.directReads.Add(1)
				}
			}
			if err != nil {
				s.st.corrupt.Add(1)
				results[i] = miss(r.Key, fmt.Sprintf("slot %d of %s failed verification", rec.Slot, f.path), err)
				dropEntry(i)
				return
			}
			results[i] = nil
		}(i, buf)
	}
	wg.Wait()
	hits := int64(0)
	for i := range results {
		if results[i] == nil {
			hits++
			s.st.reloadBytes.Add(int64(len(dsts[i])))
		}
	}
	s.st.hits.Add(hits)
	s.st.misses.Add(int64(len(batch)) - hits)
	if len(drop) > 0 {
		// NB: DeleteIf, not Delete: the entry may have been replaced by a
		// newer put since we read it; only the stale one goes.
		deleted := make([]bool, len(drop))
		if err := s.index.DeleteIf(ctx, drop, deleted); err != nil {
			s.st.indexErrors.Add(1)
			s.limiter.Warn("get-drop", "l3 get: dropping bad entries from the index failed", "entries", len(drop), "err", err)
			return nil
		}
		for i, e := range drop {
			if deleted[i] {
				s.postCtl(ctlOp{kind: ctlCorrupt, key: tiers.Key{Hash: e.Key.Hash, Kind: tiers.PayloadKind(e.Key.Kind)}, rec: e.Record})
			}
		}
	}
	return nil
}

// LongestPrefix implements tiers.Store.
func (s *Store) LongestPrefix(ctx context.Context, kind tiers.PayloadKind, chain []pagehash.Hash) (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.leave()
	if _, err := s.kindBytes(kind); err != nil {
		return 0, fmt.Errorf("l3disk longest prefix: %w", err)
	}
	const step = 256
	n := 0
	keys := make([]indexes.Key, 0, min(step, len(chain)))
	recs := make([]indexes.Record, min(step, len(chain)))
	found := make([]bool, min(step, len(chain)))
	for len(chain) > 0 {
		part := chain[:min(step, len(chain))]
		chain = chain[len(part):]
		keys = keys[:0]
		for _, h := range part {
			keys = append(keys, indexes.Key{Hash: h, Kind: uint8(kind)})
		}
		if err := s.index.Get(ctx, keys, recs[:len(keys)], found[:len(keys)]); err != nil {
			return 0, fmt.Errorf("l3disk longest prefix: index: %w: %w", tiers.ErrBroken, err)
		}
		for i := range keys {
			r := recs[i]
			if !found[i] || int(r.Disk) != s.disk || r.Kind != uint8(kind) || r.Epoch != s.files[kind].epoch() {
				return n, nil
			}
			n++
		}
	}
	return n, nil
}

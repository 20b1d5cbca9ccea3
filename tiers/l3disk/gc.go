package l3disk

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/tiers"
)

// deleteLive removes live keys: index entry first (only if it still
// points at our slot), then the slot. Keys not live here are skipped.
func (s *Store) deleteLive(keys []tiers.Key) error {
	entries := make([]indexes.Entry, 0, len(keys))
	slots := make([]int32, 0, len(keys))
	seen := make(map[tiers.Key]bool, len(keys))
	for _, key := range keys {
		pool := s.pools[key.Kind]
		slot, ok := pool.lookup(key.Hash)
		if !ok || pool.state[slot] != slotLive || seen[key] {
			continue
		}
		seen[key] = true
		entries = append(entries, indexes.Entry{Key: key.IndexKey(), Record: s.record(key.Kind, slot, 0)})
		slots = append(slots, slot)
	}
	if len(entries) == 0 {
		return nil
	}
	deleted := make([]bool, len(entries))
	if err := s.index.DeleteIf(context.Background(), entries, deleted); err != nil {
		s.st.indexErrors.Add(1)
		return fmt.Errorf("l3disk delete %d keys: index: %w", len(entries), err)
	}
	for i, e := range entries {
		// NB: free even when the entry no longer pointed at our slot
		// (deleted[i] false): nothing references the slot any more.
		s.freeLive(tiers.PayloadKind(e.Key.Kind), slots[i])
	}
	return nil
}

// collect is the page-level LRU garbage collection of one kind: when
// occupancy reaches GCStart, reclaim coldest pages until GCStop, at most
// GCBatch per pass so the put behind it never waits long. Once the index
// refused a put of this kind as full, the pages in use then (indexCap)
// stand for the capacity when smaller than the slots: an index map
// smaller than the slabs need makes a cache bounded by its index, not a
// cache that stops storing.
func (s *Store) collect(k tiers.PayloadKind) {
	pool := s.pools[k]
	size := pool.size()
	if c := s.indexCap[k]; c > 0 && c < size {
		size = c
	}
	if float64(pool.used()) >= s.cfg.GCStart*float64(size) {
		s.gcActive[k] = true
	}
	target := int(s.cfg.GCStop * float64(size))
	if !s.gcActive[k] {
		return
	}
	n := min(pool.used()-target, s.cfg.GCBatch)
	if n <= 0 {
		s.gcActive[k] = false
		return
	}
	entries := make([]indexes.Entry, 0, n)
	slots := make([]int32, 0, n)
	for slot := pool.head; slot != noSlot && len(slots) < n; slot = pool.next[slot] {
		entries = append(entries, indexes.Entry{
			Key:    indexes.Key{Hash: pool.hash[slot], Kind: uint8(k)},
			Record: s.record(k, slot, 0),
		})
		slots = append(slots, slot)
	}
	if len(slots) == 0 {
		return
	}
	deleted := make([]bool, len(entries))
	// NB: the index entry goes first, durably; only then is the slot
	// free for reuse, so a racing reader sees a miss or a header for
	// another page, never another page's bytes under this key.
	err := s.index.DeleteIf(context.Background(), entries, deleted)
	for errors.Is(err, indexes.ErrFull) && len(entries) > 1 {
		// An index map too small for one batch of deletes (its reserve
		// covers a few dozen keys at the smallest size): halve it.
		entries, slots, deleted = entries[:len(entries)/2], slots[:len(slots)/2], deleted[:len(deleted)/2]
		err = s.index.DeleteIf(context.Background(), entries, deleted)
	}
	if err != nil {
		s.st.gcIndexErrors.Add(1)
		s.limiter.Error("gc-index", "l3 gc: index delete failed; nothing reclaimed", "kind", k, "pages", len(entries), "err", err)
		return
	}
	for _, slot := range slots {
		s.freeLive(k, slot)
	}
	s.st.evicted.Add(int64(len(slots)))
	if pool.used() <= target {
		s.gcActive[k] = false
	}
}

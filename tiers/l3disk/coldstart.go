package l3disk

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
)

// headerScan is what the headers of one slab file say.
type headerScan struct {
	headers    []SlotHeader
	valid      []bool // header decodes and belongs to this file's kind and epoch
	readErrors int
	badHeaders int // written-looking but undecodable (torn or bit-rotten)
	stale      int // valid header of an older epoch or another kind
}

// scanHeaders reads the header block of every slot of f (header-only: one
// aligned block per slot, not the whole slot), depth reads in flight.
//
// With stopAtFirst it returns as soon as one valid header is found (the
// scan is then partial): the question is only whether the file holds a
// page.
func scanHeaders(ctx context.Context, f *slabFile, depth int, stopAtFirst bool) (headerScan, error) {
	n := int(f.sb.Slots)
	var found atomic.Bool
	sc := headerScan{headers: make([]SlotHeader, n), valid: make([]bool, n)}
	var (
		next         int
		mu           sync.Mutex
		wg           sync.WaitGroup
		errs         = make([]error, max(depth, 1))
		rdErr, bad   = make([]int, max(depth, 1)), make([]int, max(depth, 1))
		staleByWorkr = make([]int, max(depth, 1))
	)
	for w := range max(depth, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf, err := diskfs.NewAlignedBuffer(diskfs.BlockSize)
			if err != nil {
				errs[w] = err
				return
			}
			defer func() { _ = buf.Free() }()
			for {
				mu.Lock()
				slot := next
				next++
				mu.Unlock()
				if slot >= n || ctx.Err() != nil || found.Load() {
					return
				}
				if err := f.readHeaderBlock(int64(slot), buf.Bytes()); err != nil {
					rdErr[w]++
					continue
				}
				h, err := DecodeSlotHeader(buf.Bytes())
				if err != nil {
					if !allZero(buf.Bytes()[:HeaderSize]) {
						bad[w]++
					}
					continue
				}
				if h.Kind != f.sb.Kind || h.Epoch != f.epoch() || int64(h.PayloadLen) != f.sb.PageBytes || h.Version != f.version() {
					staleByWorkr[w]++
					continue
				}
				sc.headers[slot], sc.valid[slot] = h, true
				if stopAtFirst {
					found.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return sc, err
	}
	if err := ctx.Err(); err != nil {
		return sc, fmt.Errorf("scan %s: %w", f.path, err)
	}
	for w := range rdErr {
		sc.readErrors += rdErr[w]
		sc.badHeaders += bad[w]
		sc.stale += staleByWorkr[w]
	}
	return sc, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// ownsRecord reports whether rec names a slot of this store (its disk,
// its rank's files, a kind it has); records of other ranks sharing the
// index are never touched.
func (s *Store) ownsRecord(k indexes.Key, rec indexes.Record) bool {
	return int(rec.Disk) == s.disk && epochRank(rec.Epoch) == s.rank && int(k.Kind) < len(s.files)
}

// liveSlot is a slot the cold-start load found referenced and valid.
type liveSlot struct {
	kind     uint8
	slot     int32
	hash     pagehash.Hash
	at       uint64
	verified bool // payload CRC checked since open
}

// load rebuilds the slot pools and LRU from the slot headers cross-checked
// with the index (cold start "load"). It runs before the writer starts.
// A slot is live iff its header is valid for this file's epoch and the
// index maps the header's hash to exactly that slot; index entries that
// fail the check are dropped, valid headers that no entry references
// (orphans: written, never indexed, or reclaimed) are freed.
//
// The slabs are the truth and the index a cache of them: when the index
// was set aside as damaged at open, fails with indexes.ErrCorrupt, or holds
// nothing of this store while its slabs hold pages, load rebuilds it from
// the slot headers (verifying every payload CRC) instead.
func (s *Store) load(ctx context.Context) error {
	var reason error
	if r, ok := s.index.(indexes.Recoverer); ok {
		if err := r.OpenDamage(); err != nil {
			reason = fmt.Errorf("the index was damaged and set aside at open (it started empty): %v", err)
		}
	}
	if reason == nil {
		marked, err := s.rebuildMarked()
		if err != nil {
			return err
		}
		if marked {
			reason = fmt.Errorf("an earlier rebuild of the index did not finish (%s exists)", s.rebuildMark)
		}
	}
	var scans []headerScan
	if reason == nil {
		var err error
		if reason, scans, err = s.indexMissing(ctx); err != nil {
			return err
		}
	}
	if reason == nil {
		if scans == nil {
			scans = make([]headerScan, len(s.files))
			for k, f := range s.files {
				sc, err := scanHeaders(ctx, f, s.cfg.Depth, false)
				if err != nil {
					return err
				}
				scans[k] = sc
			}
		}
		var err error
		reason, err = s.loadFromIndex(ctx, scans)
		if err != nil || reason == nil {
			return err
		}
	}
	return s.rebuild(ctx, reason)
}

// errFound stops an iteration at its first match.
var errFound = errors.New("found")

// indexMissing returns a reason to rebuild when the index holds no entry
// of this store while a slab holds a page of its current epoch: the index
// was deleted or replaced. It reads one entry and at most one valid
// header per file, so a store with a lost index goes straight to the
// rebuild. When it had to scan every header (no entry of this store, no
// valid page) it returns those complete scans for the load to reuse.
func (s *Store) indexMissing(ctx context.Context) (reason error, scans []headerScan, err error) {
	err = s.index.Iterate(ctx, func(e indexes.Entry) error {
		if s.ownsRecord(e.Key, e.Record) {
			return errFound
		}
		return nil
	})
	switch {
	case errors.Is(err, errFound):
		return nil, nil, nil
	case errors.Is(err, indexes.ErrCorrupt):
		return fmt.Errorf("the index holds corrupt records: %w", err), nil, nil
	case err != nil:
		return nil, nil, fmt.Errorf("iterate index: %w", err)
	}
	for _, f := range s.files {
		sc, err := scanHeaders(ctx, f, s.cfg.Depth, true)
		if err != nil {
			return nil, nil, err
		}
		if slices.Contains(sc.valid, true) {
			return fmt.Errorf("the index holds no entry of this store while %s holds pages of its current epoch (index missing or replaced)", f.path), nil, nil
		}
		scans = append(scans, sc)
	}
	return nil, scans, nil
}

// loadFromIndex is the usual cold-start load. It returns a non-nil reason
// (and changes nothing) when the index must be rebuilt instead.
func (s *Store) loadFromIndex(ctx context.Context, scans []headerScan) (rebuild error, err error) {
	claimed := make([][]bool, len(s.files))
	for k := range s.files {
		claimed[k] = make([]bool, s.files[k].sb.Slots)
	}
	var (
		live []liveSlot
		drop []indexes.Entry
		// rescue: slots a dropped entry points at whose valid header
		// names another page (a damaged key, or a reused slot whose new
		// entry was lost): that page is adopted unless it is live
		// elsewhere.
		rescue []liveSlot
		stale  int
		owned  int
		top    = make([]uint64, len(s.files))
	)
	err = s.index.Iterate(ctx, func(e indexes.Entry) error {
		if !s.ownsRecord(e.Key, e.Record) {
			return nil
		}
		owned++
		k := e.Key.Kind
		f, rec := s.files[k], e.Record
		top[k] = max(top[k], rec.Epoch)
		switch {
		case rec.Epoch != f.epoch():
			stale++
			drop = append(drop, e)
		case rec.Kind != k || rec.Slot >= uint64(f.sb.Slots) || !scans[k].valid[rec.Slot] ||
			scans[k].headers[rec.Slot].Hash != e.Key.Hash || claimed[k][rec.Slot]:
			drop = append(drop, e)
			if rec.Kind == k && rec.Slot < uint64(f.sb.Slots) && scans[k].valid[rec.Slot] &&
				scans[k].headers[rec.Slot].Hash != e.Key.Hash {
				rescue = append(rescue, liveSlot{kind: k, slot: int32(rec.Slot), hash: scans[k].headers[rec.Slot].Hash, at: rec.LastAccess})
			}
		default:
			claimed[k][rec.Slot] = true
			live = append(live, liveSlot{kind: k, slot: int32(rec.Slot), hash: e.Key.Hash, at: rec.LastAccess})
		}
		return nil
	})
	if errors.Is(err, indexes.ErrCorrupt) {
		return fmt.Errorf("the index holds corrupt records: %w", err), nil
	}
	if err != nil {
		return nil, fmt.Errorf("iterate index: %w", err)
	}
	if reason, err := s.lookupsAgree(ctx, live, drop); reason != nil || err != nil {
		return reason, err
	}
	live, err = s.rescueSlots(ctx, live, rescue, claimed)
	if err != nil {
		return nil, err
	}
	valid := 0
	for k := range scans {
		for _, v := range scans[k].valid {
			if v {
				valid++
			}
		}
	}
	if owned == 0 && valid > 0 {
		return fmt.Errorf("the index holds no entry of this store while its slabs hold %d pages of the current epoch (index missing or replaced)", valid), nil
	}
	for k, f := range s.files {
		if top[k] > f.epoch() {
			// NB: the index has seen a newer epoch of this file than the
			// file says: it was rolled back (restored from a copy). Move
			// past every epoch the index has seen so none of its records
			// can ever match a slot again; the file's pages are dropped.
			old := f.epoch()
			sb := f.sb
			sb.Epoch = epochFor((top[k]>>16)+1, s.rank)
			if err := f.writeSuperblock(sb); err != nil {
				return nil, fmt.Errorf("slab %s rolled back: move its epoch past the index's: %w", f.path, err)
			}
			s.log.Error("l3 slab file rolled back to an older epoch than its index records; its pages are dropped",
				"path", f.path, "file_epoch", old>>16, "index_epoch", top[k]>>16, "new_epoch", f.epoch()>>16)
			live = slices.DeleteFunc(live, func(l liveSlot) bool { return l.kind == uint8(k) })
			clear(claimed[k])
			clear(scans[k].valid)
		}
	}
	dropped := 0
	for len(drop) > 0 {
		part := drop[:min(len(drop), 1024)]
		drop = drop[len(part):]
		deleted := make([]bool, len(part))
		if err := s.index.DeleteIf(ctx, part, deleted); err != nil {
			return nil, fmt.Errorf("drop %d bad index entries: %w", len(part), err)
		}
		for _, d := range deleted {
			if d {
				dropped++
			}
		}
	}
	s.adopt(live)
	orphans, badHeaders, readErrors := 0, 0, 0
	for k := range s.pools {
		for slot, v := range scans[k].valid {
			if v && !claimed[k][slot] {
				orphans++
			}
		}
		badHeaders += scans[k].badHeaders
		readErrors += scans[k].readErrors
	}
	s.st.loadLive.Store(int64(len(live)))
	s.st.loadOrphan.Store(int64(orphans))
	s.st.loadDropped.Store(int64(dropped))
	s.st.loadStaleEntry.Store(int64(stale))
	s.log.Info("l3 cold start load", "live", len(live), "orphans_freed", orphans,
		"entries_dropped", dropped, "stale_entries", stale, "torn_headers", badHeaders, "read_errors", readErrors)
	return nil, nil
}

// adopt makes the live slots live in the pools, coldest first.
func (s *Store) adopt(live []liveSlot) {
	slices.SortFunc(live, func(a, b liveSlot) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.kind, b.kind), cmp.Compare(a.slot, b.slot))
	})
	maxAt := uint64(0)
	for _, l := range live {
		s.pools[l.kind].occupy(l.slot, l.hash, l.at)
		s.verified[l.kind][l.slot] = l.verified
		maxAt = max(maxAt, l.at)
		s.st.usedSlots[l.kind].Add(1)
		s.st.livePages.Add(1)
		s.st.liveBytes.Add(s.pageBytes[l.kind])
	}
	s.clock.Store(maxAt)
	for k, p := range s.pools {
		p.compactFree()
		if err := p.check(); err != nil {
			// NB: broken invariant of the rebuild itself.
			panic(fmt.Sprintf("l3disk: slot pool of kind %d after load: %v", k, err))
		}
	}
}

// rebuild replaces this store's index entries with what its slabs hold:
// every slot of the current epoch whose header and payload verify.
func (s *Store) rebuild(ctx context.Context, reason error) error {
	s.log.Error("l3 cold start load: rebuilding the index from the slot headers", "reason", reason.Error())
	start := time.Now()
	// NB: marked before the old entries go: a crash anywhere from here
	// leaves an index that lacks pages the slabs hold, and the mark.
	if err := s.markRebuild(); err != nil {
		return err
	}
	// NB: reset only an index whose records are corrupt: one set aside at
	// open is already fresh, and with several ranks sharing it a reset
	// would wipe the entries another rank has just rebuilt.
	if r, ok := s.index.(indexes.Resetter); ok && errors.Is(reason, indexes.ErrCorrupt) {
		if err := r.Reset(ctx); err != nil {
			return fmt.Errorf("rebuild: reset index: %w", err)
		}
	} else if err := s.dropOwnEntries(ctx); err != nil {
		return fmt.Errorf("rebuild (%w): the index cannot be reset and its entries cannot be dropped: %w", reason, err)
	}
	var (
		rc   RebuildCounts
		live []liveSlot
	)
	put := putFunc(s.index.Put)
	deferred, isDeferred := s.index.(indexes.DeferredPutter)
	if isDeferred {
		// NB: safe only because of the mark: a power loss before the Sync
		// below leaves the mark, so the next load rebuilds again.
		put = deferred.PutDeferred
	}
	for _, f := range s.files {
		l, err := rebuildFile(ctx, put, f, s.disk, s.cfg.Depth, &rc)
		if err != nil {
			return fmt.Errorf("rebuild: %w", err)
		}
		live = append(live, l...)
	}
	if isDeferred {
		if err := deferred.Sync(ctx); err != nil {
			return fmt.Errorf("rebuild: make the index durable: %w", err)
		}
	}
	if err := s.unmarkRebuild(); err != nil {
		return err
	}
	rc.Elapsed = time.Since(start)
	s.adopt(live)
	s.rebuilt = rc
	s.st.loadLive.Store(rc.Kept)
	s.log.Warn("l3 index rebuilt from the slot headers", "pages_kept", rc.Kept, "corrupt_slots", rc.Corrupt,
		"duplicate_slots", rc.Duplicates, "unreadable_slots", rc.Unreadable, "bytes_read", rc.Bytes, "elapsed", rc.Elapsed)
	return nil
}

// rebuildMarked reports whether the rebuild mark of this store exists.
func (s *Store) rebuildMarked() (bool, error) {
	f, err := s.fs.OpenFile(s.rebuildMark, diskfs.OpenOptions{})
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	case err != nil:
		// NB: a symlink, FIFO or directory planted under the mark's
		// name is refused by the open: say so rather than guess.
		return false, fmt.Errorf("l3 cold start load: rebuild mark: %w", err)
	}
	if err := f.Close(); err != nil {
		return false, fmt.Errorf("l3 cold start load: rebuild mark: %w", err)
	}
	return true, nil
}

// markRebuild creates the rebuild mark, durably, before the rebuild writes
// its first index entry.
func (s *Store) markRebuild() error {
	f, err := s.fs.OpenFile(s.rebuildMark, diskfs.OpenOptions{Create: true})
	if err != nil {
		return fmt.Errorf("rebuild: create mark: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("rebuild: create mark: %w", err)
	}
	if err := s.fs.SyncDir(filepath.Dir(s.rebuildMark)); err != nil {
		return fmt.Errorf("rebuild: create mark: %w", err)
	}
	return nil
}

// unmarkRebuild removes the rebuild mark, durably, once every entry of the
// rebuild is.
func (s *Store) unmarkRebuild() error {
	if err := s.fs.Remove(s.rebuildMark); err != nil {
		return fmt.Errorf("rebuild: remove mark: %w", err)
	}
	if err := s.fs.SyncDir(filepath.Dir(s.rebuildMark)); err != nil {
		return fmt.Errorf("rebuild: remove mark: %w", err)
	}
	return nil
}

// dropOwnEntries deletes this store's entries from an index that cannot
// be reset (a plugin): others' entries stay.
func (s *Store) dropOwnEntries(ctx context.Context) error {
	var own []indexes.Entry
	if err := s.index.Iterate(ctx, func(e indexes.Entry) error {
		if s.ownsRecord(e.Key, e.Record) {
			own = append(own, e)
		}
		return nil
	}); err != nil {
		return err
	}
	for len(own) > 0 {
		part := own[:min(len(own), 1024)]
		own = own[len(part):]
		if err := s.index.DeleteIf(ctx, part, make([]bool, len(part))); err != nil {
			return err
		}
	}
	return nil
}

// Rebuilt returns what the cold start's index rebuild did (zero when the
// index was loaded as it was).
func (s *Store) Rebuilt() RebuildCounts { return s.rebuilt }

// LoadCounts reports what the last cold-start load found.
type LoadCounts struct {
	// Live slots kept, orphan slots freed, index entries dropped (stale
	// epoch or no matching slot), of which stale epoch.
	Live, Orphans, Dropped, Stale int64
}

// LoadCounts returns the counts of the cold-start load (zero after clear).
func (s *Store) LoadCounts() LoadCounts {
	return LoadCounts{Live: s.st.loadLive.Load(), Orphans: s.st.loadOrphan.Load(),
		Dropped: s.st.loadDropped.Load(), Stale: s.st.loadStaleEntry.Load()}
}

// sweepStale removes this store's index entries of older epochs after a
// cold start clear, in the background: the clear itself is O(1) (an epoch
// bump), and stale entries are misses until the sweep drops them.
func (s *Store) sweepStale(ctx context.Context) {
	var stale []indexes.Entry
	err := s.index.Iterate(ctx, func(e indexes.Entry) error {
		if s.ownsRecord(e.Key, e.Record) && e.Record.Epoch != s.files[e.Key.Kind].epoch() {
			stale = append(stale, e)
		}
		return ctx.Err()
	})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("l3 stale-entry sweep: iterate failed", "err", err)
		}
		return
	}
	n := 0
	for len(stale) > 0 && ctx.Err() == nil {
		part := stale[:min(len(stale), 1024)]
		stale = stale[len(part):]
		deleted := make([]bool, len(part))
		if err := s.index.DeleteIf(ctx, part, deleted); err != nil {
			if ctx.Err() == nil {
				s.log.Warn("l3 stale-entry sweep: delete failed", "err", err)
			}
			return
		}
		n += len(part)
	}
	if n > 0 {
		s.st.staleDropped.Add(int64(n))
		s.log.Info("l3 stale-entry sweep done", "entries", n)
	}
}

// lookupsAgree returns a reason to rebuild when a point lookup of an
// entry that the index's iteration returned does not find the same record.
// A damaged inner page (a flipped bit in a separator key) leaves the leaves
// in order, so iteration sees every entry while lookups of the keys beside
// the damage go to the wrong leaf and miss: those pages would be lost for
// good, held in slots that nothing can reach, and the entries to drop could
// not be deleted. One batched lookup of each entry at cold start
// (microseconds each, against the header scan's read of every slot) catches
// it.
func (s *Store) lookupsAgree(ctx context.Context, live []liveSlot, drop []indexes.Entry) (rebuild error, err error) {
	const part = 4096
	n := len(live) + len(drop)
	want := func(i int) indexes.Entry {
		if i < len(live) {
			l := live[i]
			return indexes.Entry{Key: indexes.Key{Hash: l.hash, Kind: l.kind}, Record: indexes.Record{Kind: l.kind, Slot: uint64(l.slot)}}
		}
		return drop[i-len(live)]
	}
	keys := make([]indexes.Key, 0, min(n, part))
	recs := make([]indexes.Record, min(n, part))
	found := make([]bool, min(n, part))
	for start := 0; start < n; start += part {
		end := min(n, start+part)
		keys = keys[:0]
		for i := start; i < end; i++ {
			keys = append(keys, want(i).Key)
		}
		recs, found := recs[:len(keys)], found[:len(keys)]
		err := s.index.Get(ctx, keys, recs, found)
		if errors.Is(err, indexes.ErrCorrupt) {
			return fmt.Errorf("a lookup of an iterated entry read a corrupt record: %w", err), nil
		}
		if err != nil {
			return nil, fmt.Errorf("look up %d index entries: %w", len(keys), err)
		}
		for j := range keys {
			w := want(start + j).Record
			if !found[j] || recs[j].Kind != w.Kind || recs[j].Slot != w.Slot {
				// NB: ErrCorrupt, so that the rebuild resets the index:
				// deletes through a misrouting tree would miss the same
				// entries.
				return fmt.Errorf("the index's iteration holds %s at slot %d that a lookup of the same key does not find (a damaged inner page): %w", keys[j], w.Slot, indexes.ErrCorrupt), nil
			}
		}
	}
	return nil, nil
}

// rescueSlots adopts the rescue candidates (see loadFromIndex) whose slot
// is still unclaimed and whose page is not live in another slot, indexing
// them under their headers' hashes. Their payloads are checked at their
// first read, like every slot the load keeps.
func (s *Store) rescueSlots(ctx context.Context, live, rescue []liveSlot, claimed [][]bool) ([]liveSlot, error) {
	if len(rescue) == 0 {
		return live, nil
	}
	type kh struct {
		kind uint8
		hash pagehash.Hash
	}
	have := make(map[kh]bool, len(live))
	for _, l := range live {
		have[kh{l.kind, l.hash}] = true
	}
	var puts []indexes.Entry
	for _, r := range rescue {
		if claimed[r.kind][r.slot] || have[kh{r.kind, r.hash}] {
			continue
		}
		claimed[r.kind][r.slot] = true
		have[kh{r.kind, r.hash}] = true
		live = append(live, r)
		puts = append(puts, indexes.Entry{Key: indexes.Key{Hash: r.hash, Kind: r.kind}, Record: s.record(tiers.PayloadKind(r.kind), r.slot, r.at)})
	}
	if len(puts) == 0 {
		return live, nil
	}
	if err := s.index.Put(ctx, puts); err != nil {
		return nil, fmt.Errorf("index %d pages whose entries were damaged: %w", len(puts), err)
	}
	s.log.Warn("l3 cold start load: pages whose index entries named another page are indexed again under their slot headers", "pages", len(puts))
	return live, nil
}

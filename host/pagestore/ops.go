package pagestore

import (
	"context"
	"fmt"
	"hash/crc32"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kvtier/kvtier/api/storev1"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

// parallelCRCBytes: a batch of at least this many bytes is checksummed by
// several goroutines.
const parallelCRCBytes = 4 << 20

// forPages runs f(i) for i in [0, n), on several goroutines when the
// pages' bytes are many.
func (d *Door) forPages(n int, f func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), n)
	if workers <= 1 || int64(n)*d.pageBytes < parallelCRCBytes {
		for i := range n {
			f(i)
		}
		return
	}
	var wg sync.WaitGroup
	var next sync.Mutex
	at := 0
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next.Lock()
				i := at
				at++
				next.Unlock()
				if i >= n {
					return
				}
				f(i)
			}
		}()
	}
	wg.Wait()
}

// checksum returns slot's CRC32C per kind.
func (d *Door) checksum(slot int32) []uint32 {
	out := make([]uint32, len(d.kinds))
	for k := range d.kinds {
		out[k] = crc32.Checksum(d.view(slot, k), castagnoli)
	}
	return out
}

// verify says whether slot's bytes still match crc.
func (d *Door) verify(slot int32, crc []uint32) bool {
	for k := range d.kinds {
		if crc32.Checksum(d.view(slot, k), castagnoli) != crc[k] {
			return false
		}
	}
	return true
}

func (d *Door) spansOf(slot int32) []*pb.Span {
	out := make([]*pb.Span, len(d.kinds))
	for k := range d.kinds {
		s := d.span(slot, k)
		out[k] = &pb.Span{Slab: uint32(s.Slab), Offset: uint64(s.Offset), Length: uint64(s.Length)}
	}
	return out
}

func (d *Door) checkBatch(n int) error {
	if n > d.opt.Limits.MaxBatchPages {
		return status.Errorf(codes.InvalidArgument, "keys: %d, at most %d a call (limits.max_batch_pages)", n, d.opt.Limits.MaxBatchPages)
	}
	return nil
}

// BatchExists counts the leading keys whose pages are stored: in the slab
// first, else in the store (each kind present; a later page after a
// missing one does not count). It never reads a page.
func (d *Door) BatchExists(ctx context.Context, q *pb.ExistsRequest) (*pb.ExistsReply, error) {
	ses, err := d.session(q.GetSession())
	if err != nil {
		return nil, err
	}
	keys := q.GetKeys()
	if err := d.checkBatch(len(keys)); err != nil {
		return nil, err
	}
	hs := make([]pagehash.Hash, len(keys))
	ok := make([]bool, len(keys))
	d.hashKeys(ses, keys, hs, ok)
	n := len(keys)
	for i := range keys {
		if !ok[i] {
			n = i
			break
		}
	}
	inL2 := make([]bool, n)
	d.mu.Lock()
	d.st.existsCalls++
	for i := range n {
		e := d.entries[hs[i]]
		inL2[i] = e != nil && (e.state == stCommitted || e.state == stCommitting)
	}
	d.mu.Unlock()
	out := &pb.ExistsReply{BootId: d.opt.BootID}
	for i := 0; i < n; {
		if inL2[i] {
			out.Tiers = append(out.Tiers, pb.Tier_TIER_L2)
			i++
			continue
		}
		if d.opt.Store == nil {
			break
		}
		j := i
		for j < n && !inL2[j] {
			j++
		}
		m := j - i
		for k := range d.kinds {
			c, err := d.opt.Store.LongestPrefix(ctx, tiers.PayloadKind(k), hs[i:i+m])
			if err != nil {
				d.log.Warn("kvtier store: exists: store lookup failed", "store", d.opt.StoreName, "err", err)
				c = 0
			}
			m = min(m, c)
		}
		for range m {
			out.Tiers = append(out.Tiers, pb.Tier_TIER_L3)
		}
		i += m
		if i < j {
			break
		}
	}
	out.Present = uint32(len(out.Tiers))
	if q.GetPrefetch() {
		var l3 []pagehash.Hash
		for i, t := range out.Tiers {
			if t == pb.Tier_TIER_L3 {
				l3 = append(l3, hs[i])
			}
		}
		d.prefetch(l3)
	}
	return out, nil
}

// prefetch starts reloading hs (pages the store holds) into the slab on a
// background load that installs them unpinned, as an abandoned BatchGet's
// load does. It never waits: a page with no free or evictable slot, or
// past the door's prefetch budget (a quarter of the slab loading at
// once), stays in L3 and is counted as skipped. A page a BatchGet asks
// for while its prefetch is loading is loaded by that get too (the first
// to land is kept).
func (d *Door) prefetch(hs []pagehash.Hash) {
	if len(hs) == 0 || d.opt.Store == nil {
		return
	}
	if err := d.enter(); err != nil {
		return
	}
	defer d.leave()
	ld := &load{done: make(chan struct{}), abandoned: true}
	d.mu.Lock()
	for _, h := range hs {
		if d.entries[h] != nil {
			continue // in the slab already (or being set)
		}
		if d.loading >= max(1, d.nslots/4) {
			d.st.prefetchSkipped++
			continue
		}
		s := d.alloc()
		if s < 0 {
			d.st.prefetchSkipped++
			continue
		}
		ld.slots = append(ld.slots, s)
		ld.hs = append(ld.hs, h)
		ld.idx = append(ld.idx, -1)
		d.loading++
		d.st.prefetch++
	}
	d.mu.Unlock()
	if len(ld.slots) > 0 {
		d.startLoad(ld)
	}
}

// storeHolds says which of chain's pages the store holds (every kind), by
// index lookups alone: LongestPrefix runs, each resumed after the page
// that ended the previous one.
func (d *Door) storeHolds(ctx context.Context, chain []pagehash.Hash) []bool {
	out := make([]bool, len(chain))
	for pos := 0; pos < len(chain); {
		m := len(chain) - pos
		for k := range d.kinds {
			c, err := d.opt.Store.LongestPrefix(ctx, tiers.PayloadKind(k), chain[pos:pos+m])
			if err != nil {
				d.log.Warn("kvtier store: get: store lookup failed", "store", d.opt.StoreName, "err", err)
				return out
			}
			m = min(m, c)
			if m == 0 {
				break
			}
		}
		for j := pos; j < pos+m; j++ {
			out[j] = true
		}
		pos += m + 1 // NB: chain[pos+m] is absent
	}
	return out
}

// load is one BatchGet's reload from the store.
type load struct {
	idx   []int   // the keys' positions in the call
	slots []int32 // the slots reserved for them
	hs    []pagehash.Hash
	hit   []bool
	crc   [][]uint32
	// finished: the handler takes the results; abandoned: the handler
	// left (deadline), the goroutine installs them unpinned. Under d.mu.
	finished, abandoned bool
	done                chan struct{}
}

// deadline returns how long a BatchGet may wait for reloads.
func (d *Door) deadline(ctx context.Context, ms uint32) time.Duration {
	l := d.opt.Limits
	t := l.DefaultDeadline
	if ms > 0 {
		t = min(time.Duration(ms)*time.Millisecond, l.MaxDeadline)
	}
	if dl, ok := ctx.Deadline(); ok {
		t = min(t, time.Until(dl))
	}
	return max(t, 0)
}

// BatchGet pins the keys' pages in the slab, reloading them from the
// store first where needed (bounded by the deadline), and says where
// they lie.
func (d *Door) BatchGet(ctx context.Context, q *pb.GetRequest) (*pb.GetReply, error) {
	ses, err := d.session(q.GetSession())
	if err != nil {
		return nil, err
	}
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.leave()
	keys := q.GetKeys()
	if err := d.checkBatch(len(keys)); err != nil {
		return nil, err
	}
	wait := d.deadline(ctx, q.GetDeadlineMs())
	hs := make([]pagehash.Hash, len(keys))
	ok := make([]bool, len(keys))
	d.hashKeys(ses, keys, hs, ok)
	out := &pb.GetReply{BootId: d.opt.BootID, Pages: make([]*pb.GetPage, len(keys))}
	l := &lease{ses: ses, pinned: make([]*entry, len(keys)), expires: time.Now().Add(d.opt.Limits.Lease)}
	var ld *load
	// L2 hits to verify: positions, and their entries, slots and CRCs as
	// pinned (the lease may end meanwhile: a Close, a dropped connection).
	var check []int
	var checkE []*entry
	var checkSlot []int32
	var checkCRC [][]uint32
	var cand []int // keys the slab lacks: reloads, if the store holds them
	// keys whose pages are committing (checksums being taken) and what
	// closes when they are done
	var committing []int
	var ready []chan struct{}
	d.mu.Lock()
	if _, open := d.sessions[ses.id]; !open {
		d.mu.Unlock()
		return nil, status.Errorf(codes.NotFound, "session %q: %v", ses.id, errUnknownSession)
	}
	d.nextLease++
	l.id = d.nextLease
	d.leases[l.id] = l
	ses.leases[l.id] = l
	d.st.getPages += uint64(len(keys))
	for i := range keys {
		if !ok[i] {
			out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_INVALID}
			continue
		}
		if e := d.entries[hs[i]]; e != nil {
			if e.state == stCommitting {
				// Committed, its checksum being taken: wait for it.
				committing = append(committing, i)
				ready = append(ready, e.ready)
				continue
			}
			if e.state != stCommitted {
				// Being set by a client: not readable yet.
				out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_MISS}
				d.st.miss++
				continue
			}
			e.pins++
			d.updateEvictable(e)
			d.hit(e)
			l.pinned[i] = e
			out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_HIT, Tier: pb.Tier_TIER_L2, Spans: d.spansOf(e.slot)}
			check = append(check, i)
			checkE, checkSlot, checkCRC = append(checkE, e), append(checkSlot, e.slot), append(checkCRC, e.crc)
			continue
		}
		if d.opt.Store == nil {
			out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_MISS}
			d.st.miss++
			continue
		}
		cand = append(cand, i)
	}
	d.mu.Unlock()
	if len(committing) > 0 {
		d.awaitCommitting(ctx, wait, l, hs, committing, ready, out)
	}
	if len(cand) > 0 {
		// Only pages the store holds take a slot (and may evict): a get
		// of absent keys must not empty the slab.
		chain := make([]pagehash.Hash, len(cand))
		for j, i := range cand {
			chain[j] = hs[i]
		}
		held := d.storeHolds(ctx, chain)
		d.mu.Lock()
		for j, i := range cand {
			if e := d.entries[hs[i]]; e != nil && e.state == stCommitted && !l.ended {
				// Reloaded by another call meanwhile: a slab hit now.
				e.pins++
				d.updateEvictable(e)
				d.hit(e)
				l.pinned[i] = e
				out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_HIT, Tier: pb.Tier_TIER_L2, Spans: d.spansOf(e.slot)}
				check = append(check, i)
				checkE, checkSlot, checkCRC = append(checkE, e), append(checkSlot, e.slot), append(checkCRC, e.crc)
				continue
			}
			if !held[j] {
				out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_MISS}
				d.st.miss++
				continue
			}
			s := d.alloc()
			if s < 0 && d.waitCommits() {
				// Committed pages became evictable; the map may have
				// changed meanwhile (a key being set now is not read).
				if d.entries[hs[i]] != nil {
					out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_MISS}
					d.st.miss++
					continue
				}
				s = d.alloc()
			}
			if s < 0 {
				out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_NO_SPACE}
				d.st.noSpace++
				continue
			}
			if ld == nil {
				ld = &load{done: make(chan struct{})}
			}
			ld.idx = append(ld.idx, i)
			ld.slots = append(ld.slots, s)
			ld.hs = append(ld.hs, hs[i])
			d.loading++
		}
		d.mu.Unlock()
	}
	if ld != nil {
		d.startLoad(ld)
	}
	if !d.opt.SkipVerify && len(check) > 0 && q.GetCheckAtRelease() {
		d.startCheck(ses, l, keys, check, checkE, checkSlot, checkCRC)
	} else if !d.opt.SkipVerify && len(check) > 0 {
		bad := make([]bool, len(check))
		d.forPages(len(check), func(j int) { bad[j] = !d.verify(checkSlot[j], checkCRC[j]) })
		d.mu.Lock()
		for _, i := range d.applyCheck(ses, l, keys, check, checkE, checkSlot, bad, "answered as a miss") {
			out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_CORRUPT}
		}
		d.mu.Unlock()
	} else if len(check) > 0 {
		d.mu.Lock()
		d.st.hitL2 += uint64(len(check))
		d.st.readBytes += uint64(len(check)) * uint64(d.pageBytes)
		d.mu.Unlock()
	}
	if ld != nil {
		timer := time.NewTimer(wait)
		select {
		case <-ld.done:
		case <-timer.C:
		case <-ctx.Done():
		}
		timer.Stop()
		d.mu.Lock()
		if !ld.finished {
			ld.abandoned = true
			for _, i := range ld.idx {
				out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_TIMEOUT}
			}
			d.st.timeout += uint64(len(ld.idx))
		} else {
			for j, i := range ld.idx {
				if !ld.hit[j] {
					d.free = append(d.free, ld.slots[j])
					out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_MISS}
					d.st.miss++
					continue
				}
				slot := d.install(ld.hs[j], ld.slots[j], ld.crc[j], l, i)
				out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_HIT, Tier: pb.Tier_TIER_L3, Spans: d.spansOf(slot)}
				d.st.hitL3++
				d.st.readBytes += uint64(d.pageBytes)
			}
		}
		d.mu.Unlock()
	}
	d.mu.Lock()
	held := len(l.detached) > 0
	for _, e := range l.pinned {
		held = held || e != nil
	}
	switch {
	case l.ended:
		// The session ended meanwhile: its pins are gone, and so are
		// the hits.
		for i, p := range out.Pages {
			if p.GetStatus() == pb.GetStatus_GET_STATUS_HIT {
				out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_MISS}
			}
		}
	case !held:
		d.endLease(l, false)
	default:
		out.Lease = l.id
	}
	d.mu.Unlock()
	return out, nil
}

// awaitCommitting waits (within the get's deadline) for the pages at
// positions committing, whose checksums their Commit is taking, and pins
// those that became readable as L2 hits: their checksums were just taken
// from these bytes, so they are not checked again.
func (d *Door) awaitCommitting(ctx context.Context, wait time.Duration, l *lease, hs []pagehash.Hash, committing []int, ready []chan struct{}, out *pb.GetReply) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for _, c := range ready {
		select {
		case <-c:
		case <-timer.C:
		case <-ctx.Done():
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, i := range committing {
		e := d.entries[hs[i]]
		switch {
		case e == nil || l.ended:
			out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_MISS}
			d.st.miss++
		case e.state != stCommitted:
			out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_TIMEOUT}
			d.st.timeout++
		default:
			e.pins++
			d.updateEvictable(e)
			d.hit(e)
			l.pinned[i] = e
			out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_HIT, Tier: pb.Tier_TIER_L2, Spans: d.spansOf(e.slot)}
			d.st.hitL2++
			d.st.readBytes += uint64(d.pageBytes)
		}
	}
}

// applyCheck, under d.mu, counts a get's checked L2 hits (positions
// check, their entries es in slots) and drops those that failed (bad),
// unpinning them from the live lease l; it returns the failed positions.
func (d *Door) applyCheck(ses *session, l *lease, keys []string, check []int, es []*entry, slots []int32, bad []bool, what string) []int {
	var failed []int
	for j, i := range check {
		e := es[j]
		if !bad[j] {
			d.st.hitL2++
			d.st.readBytes += uint64(d.pageBytes)
			continue
		}
		d.st.corrupt++
		d.st.verifyFailures++
		d.log.Error("kvtier store: slab page failed its checksum: dropped, "+what, "session", ses.id, "key", keys[i], "slot", slots[j])
		if !l.ended && l.pinned[i] == e {
			l.pinned[i] = nil
			e.pins--
		}
		d.drop(e)
		failed = append(failed, i)
	}
	return failed
}

// startCheck checks a check_at_release get's L2 hits on a goroutine while
// the client copies them; Release waits for it and reports the failures.
// The lease's pins keep the slots from reuse until then; a lease that ends
// first (expiry, Close) voids the check, and nothing is dropped on it.
func (d *Door) startCheck(ses *session, l *lease, keys []string, check []int, es []*entry, slots []int32, crcs [][]uint32) {
	pc := &pendingCheck{done: make(chan struct{})}
	d.mu.Lock()
	l.chk = pc
	d.mu.Unlock()
	d.busy.Add(1) // NB: inside the BatchGet's own enter, as startLoad
	go func() {
		defer d.busy.Done()
		defer close(pc.done)
		bad := make([]bool, len(check))
		d.forPages(len(check), func(j int) { bad[j] = !d.verify(slots[j], crcs[j]) })
		d.mu.Lock()
		defer d.mu.Unlock()
		if l.ended {
			pc.void = true
			return
		}
		for _, i := range d.applyCheck(ses, l, keys, check, es, slots, bad, "reported at Release") {
			pc.corrupt = append(pc.corrupt, uint32(i))
		}
	}()
}

// install makes a reloaded page readable (under d.mu) and, with a live
// lease l, pins it for key i; it returns the slot the page lies in. A key
// that is already committed keeps its entry (the reloaded slot is freed);
// one that another client is setting pins the reloaded slot outside the
// map.
func (d *Door) install(h pagehash.Hash, slot int32, crc []uint32, l *lease, i int) int32 {
	pin := l != nil && !l.ended
	if e := d.entries[h]; e != nil {
		if e.state == stCommitted {
			d.free = append(d.free, slot)
			if pin {
				e.pins++
				d.updateEvictable(e)
				l.pinned[i] = e
			}
			d.hit(e)
			return e.slot
		}
		if pin {
			l.detached = append(l.detached, slot)
		} else {
			d.free = append(d.free, slot)
		}
		return slot
	}
	e := &entry{hash: h, slot: slot, state: stCommitted, crc: crc}
	if pin {
		e.pins = 1
		l.pinned[i] = e
	}
	d.insert(e)
	return slot
}

// startLoad reads ld's pages from the store into their slots on a
// goroutine. A late finish (the handler gave up) installs the hits
// unpinned, so the client's retry finds them in the slab, and frees the
// rest: a slot is reused only after the store's Get returned.
func (d *Door) startLoad(ld *load) {
	nk := len(d.kinds)
	batch := make([]tiers.GetRequest, 0, len(ld.slots)*nk)
	for j, s := range ld.slots {
		for k := range nk {
			batch = append(batch, tiers.GetRequest{Key: tiers.Key{Hash: ld.hs[j], Kind: tiers.PayloadKind(k)}, Dst: d.span(s, k)})
		}
	}
	d.busy.Add(1) // NB: inside the BatchGet's own enter, so never after Stop's wait began
	go func() {
		defer d.busy.Done()
		res := make([]error, len(batch))
		err := d.opt.Store.Get(context.Background(), batch, res)
		ld.hit = make([]bool, len(ld.slots))
		ld.crc = make([][]uint32, len(ld.slots))
		for j := range ld.slots {
			ld.hit[j] = err == nil
			for k := range nk {
				ld.hit[j] = ld.hit[j] && res[j*nk+k] == nil
			}
		}
		if err != nil {
			d.log.Warn("kvtier store: reload failed", "store", d.opt.StoreName, "pages", len(ld.slots), "err", err)
		}
		d.forPages(len(ld.slots), func(j int) {
			if ld.hit[j] {
				ld.crc[j] = d.checksum(ld.slots[j])
			}
		})
		d.mu.Lock()
		d.loading -= len(ld.slots)
		if ld.abandoned {
			for j := range ld.slots {
				if ld.hit[j] {
					d.install(ld.hs[j], ld.slots[j], ld.crc[j], nil, 0)
				} else {
					d.free = append(d.free, ld.slots[j])
				}
			}
		} else {
			ld.finished = true
		}
		d.mu.Unlock()
		close(ld.done)
	}()
}

// Release ends a BatchGet's lease.
func (d *Door) Release(ctx context.Context, q *pb.ReleaseRequest) (*pb.ReleaseReply, error) {
	ses, err := d.session(q.GetSession())
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	l := ses.leases[q.GetLease()]
	if l == nil || l.set {
		return nil, status.Errorf(codes.NotFound, "lease %d: no BatchGet lease of this session (released, expired, or never given)", q.GetLease())
	}
	out := &pb.ReleaseReply{BootId: d.opt.BootID}
	if pc := l.chk; pc != nil {
		// The check holds no lock while it reads; wait for it outside
		// d.mu (it is CPU work over pinned pages: bounded).
		d.mu.Unlock()
		select {
		case <-pc.done:
		case <-ctx.Done():
		}
		d.mu.Lock()
		select {
		case <-pc.done:
		default:
			return nil, status.Errorf(codes.DeadlineExceeded, "lease %d: the check of its hits did not finish before the call's deadline: use none of them", q.GetLease())
		}
		if pc.void || l.ended {
			return nil, status.Errorf(codes.NotFound, "lease %d: ended (expired, or its session closed) before its check finished: use none of its hits", q.GetLease())
		}
		out.Corrupt = pc.corrupt
	}
	d.endLease(l, false)
	return out, nil
}

// BatchSet reserves a slot for each key not stored yet.
func (d *Door) BatchSet(ctx context.Context, q *pb.SetRequest) (*pb.SetReply, error) {
	ses, err := d.session(q.GetSession())
	if err != nil {
		return nil, err
	}
	keys := q.GetKeys()
	if err := d.checkBatch(len(keys)); err != nil {
		return nil, err
	}
	hs := make([]pagehash.Hash, len(keys))
	ok := make([]bool, len(keys))
	d.hashKeys(ses, keys, hs, ok)
	if len(keys) > 1 {
		seen := make(map[string]struct{}, len(keys))
		for i, k := range keys {
			if _, dup := seen[k]; dup {
				ok[i] = false
			}
			seen[k] = struct{}{}
		}
	}
	inStore := d.storeHas(ctx, hs, ok)
	out := &pb.SetReply{BootId: d.opt.BootID, Pages: make([]*pb.SetPage, len(keys))}
	l := &lease{ses: ses, set: true, res: make([]*entry, len(keys)), status: make([]pb.SetStatus, len(keys)), expires: time.Now().Add(d.opt.Limits.Lease)}
	reserved := 0
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, open := d.sessions[ses.id]; !open {
		return nil, status.Errorf(codes.NotFound, "session %q: %v", ses.id, errUnknownSession)
	}
	d.st.setPages += uint64(len(keys))
	for i := range keys {
		st := pb.SetStatus_SET_STATUS_INVALID
		switch {
		case !ok[i]:
		case d.entries[hs[i]] != nil, inStore[i]:
			// In the slab (or being set by another client), or in the
			// store already: one copy is kept.
			st = pb.SetStatus_SET_STATUS_EXISTS
			d.st.exists++
		default:
			s := d.alloc()
			if s < 0 && d.waitCommits() {
				// Committed pages became evictable; the map may have
				// changed meanwhile.
				if _, open := d.sessions[ses.id]; !open {
					// Closed meanwhile: this call's reservations go too.
					for _, e := range l.res {
						if e != nil {
							d.abandon(e, false)
						}
					}
					return nil, status.Errorf(codes.NotFound, "session %q: %v", ses.id, errUnknownSession)
				}
				if d.entries[hs[i]] != nil {
					st = pb.SetStatus_SET_STATUS_EXISTS
					d.st.exists++
					break
				}
				s = d.alloc()
			}
			if s < 0 {
				st = pb.SetStatus_SET_STATUS_NO_SPACE
				d.st.noSpace++
				break
			}
			e := &entry{hash: hs[i], slot: s, state: stReserved}
			d.entries[hs[i]] = e
			l.res[i] = e
			st = pb.SetStatus_SET_STATUS_RESERVED
			reserved++
		}
		l.status[i] = st
		out.Pages[i] = &pb.SetPage{Status: st}
		if st == pb.SetStatus_SET_STATUS_RESERVED {
			out.Pages[i].Spans = d.spansOf(l.res[i].slot)
		}
	}
	if reserved > 0 {
		d.nextLease++
		l.id = d.nextLease
		d.leases[l.id] = l
		ses.leases[l.id] = l
		out.Lease = l.id
	}
	return out, nil
}

// storeHas marks the leading valid keys, among those the slab lacks,
// whose pages the store holds (every kind): a set of them is EXISTS, not
// a second write of the same bytes. One index lookup per kind, outside
// the lock.
func (d *Door) storeHas(ctx context.Context, hs []pagehash.Hash, ok []bool) []bool {
	if d.opt.Store == nil {
		return make([]bool, len(hs))
	}
	var idx []int
	var chain []pagehash.Hash
	d.mu.Lock()
	for i := range hs {
		if ok[i] && d.entries[hs[i]] == nil {
			idx = append(idx, i)
			chain = append(chain, hs[i])
		}
	}
	d.mu.Unlock()
	m := len(chain)
	for k := range d.kinds {
		if m == 0 {
			break
		}
		c, err := d.opt.Store.LongestPrefix(ctx, tiers.PayloadKind(k), chain[:m])
		if err != nil {
			d.log.Warn("kvtier store: set: store lookup failed", "store", d.opt.StoreName, "err", err)
			c = 0
		}
		m = min(m, c)
	}
	out := make([]bool, len(hs))
	for _, i := range idx[:m] {
		out[i] = true
	}
	return out
}

// Commit makes the written pages of a BatchSet readable (checksummed
// first), writes them through to the store, and frees the others.
func (d *Door) Commit(_ context.Context, q *pb.CommitRequest) (*pb.CommitReply, error) {
	ses, err := d.session(q.GetSession())
	if err != nil {
		return nil, err
	}
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.leave()
	written := q.GetWritten()
	d.mu.Lock()
	l := ses.leases[q.GetLease()]
	if q.GetLease() == 0 || l == nil || !l.set {
		d.mu.Unlock()
		return nil, status.Errorf(codes.NotFound, "lease %d: no BatchSet lease of this session (committed, expired, or never given): its reservations are gone, nothing of it is stored", q.GetLease())
	}
	if len(written) != len(l.status) {
		d.mu.Unlock()
		return nil, status.Errorf(codes.InvalidArgument, "written: %d entries, the BatchSet had %d keys", len(written), len(l.status))
	}
	// The lease is ours now: take it out, so expiry cannot free what we
	// commit.
	l.ended = true
	delete(d.leases, l.id)
	delete(ses.leases, l.id)
	var commit []*entry
	var at []int
	for i, e := range l.res {
		if e == nil {
			continue
		}
		if written[i] {
			commit = append(commit, e)
			at = append(at, i)
		} else {
			d.abandon(e, false)
		}
	}
	out := &pb.CommitReply{Stored: make([]bool, len(l.status)), BootId: d.opt.BootID}
	for i, st := range l.status {
		out.Stored[i] = st == pb.SetStatus_SET_STATUS_EXISTS
	}
	for j, e := range commit {
		e.state = stCommitting
		e.ready = make(chan struct{})
		out.Stored[at[j]] = true
		d.st.stored++
		d.st.writtenBytes += uint64(d.pageBytes)
	}
	d.mu.Unlock()
	if len(commit) > 0 {
		// The checksums are taken off the call: the client's copy is
		// done and its backup thread goes on; a get of these pages waits
		// for them (ready), a set finds them EXISTS, and a call that finds
		// no free slot waits for them too (waitCommits).
		done := make(chan struct{})
		d.mu.Lock()
		if d.commits == nil {
			d.commits = map[chan struct{}]struct{}{}
		}
		d.commits[done] = struct{}{}
		d.mu.Unlock()
		d.busy.Add(1) // NB: inside the Commit's own enter, as startLoad
		go d.finishCommit(commit, done)
	}
	return out, nil
}

// waitCommits, under d.mu, waits for the Commits whose checksums are
// being taken (their slots become evictable then), releasing d.mu
// meanwhile; it reports whether there were any. The caller re-reads
// what it read under d.mu before.
func (d *Door) waitCommits() bool {
	if len(d.commits) == 0 {
		return false
	}
	chans := make([]chan struct{}, 0, len(d.commits))
	for c := range d.commits {
		chans = append(chans, c)
	}
	d.mu.Unlock()
	for _, c := range chans {
		<-c // CPU work over slab pages: bounded
	}
	d.mu.Lock()
	return true
}

// finishCommit takes committed pages' checksums, makes them readable and
// evictable, and starts their write-through.
func (d *Door) finishCommit(commit []*entry, done chan struct{}) {
	defer d.busy.Done()
	crcs := make([][]uint32, len(commit))
	d.forPages(len(commit), func(j int) { crcs[j] = d.checksum(commit[j].slot) })
	nk := len(d.kinds)
	var puts []tiers.PutRequest
	var items []putItem
	d.mu.Lock()
	for j, e := range commit {
		e.crc = crcs[j]
		e.state = stCommitted
		close(e.ready)
		e.ready = nil
		if d.opt.Store != nil {
			e.putPending = int32(nk)
			for k := range nk {
				puts = append(puts, tiers.PutRequest{Key: tiers.Key{Hash: e.hash, Kind: tiers.PayloadKind(k)}, Src: d.span(e.slot, k)})
				items = append(items, putItem{e: e})
			}
		}
		d.insert(e)
	}
	d.mu.Unlock()
	if len(puts) > 0 {
		d.writeThrough(puts, items)
	}
	// NB: only now, with the write-through's puts registered: until then
	// PendingPuts counts this commit, so "0 pending" still means every
	// committed, unpinned page is evictable.
	d.mu.Lock()
	delete(d.commits, done)
	close(done)
	d.mu.Unlock()
}

// writeThrough puts committed pages to the store from their slab spans
// (no copy here: the store gathers them).
func (d *Door) writeThrough(puts []tiers.PutRequest, items []putItem) {
	id, err := d.opt.Store.Put(context.Background(), puts)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		d.log.Warn("kvtier store: write-through refused", "store", d.opt.StoreName, "items", len(puts), "err", err)
		d.st.putFailures += uint64(len(puts))
		for _, it := range items {
			it.e.putPending--
			if it.e.dead {
				d.maybeFree(it.e)
			} else {
				d.updateEvictable(it.e)
			}
		}
		return
	}
	b := &putBatch{items: items}
	d.puts[id] = b
	for _, a := range d.early[id] {
		if d.puts[id] == nil {
			break
		}
		d.applyAck(id, b, a)
	}
	delete(d.early, id)
	check := d.takeGathered()
	d.mu.Unlock()
	d.checkGathered(check)
	d.mu.Lock()
}

// Clear forgets every page of the session's namespace: its generation is
// bumped (and kept across restarts), so no key hashes to an old page
// again; the old pages age out by eviction.
func (d *Door) Clear(_ context.Context, q *pb.ClearRequest) (*pb.ClearReply, error) {
	ses, err := d.session(q.GetSession())
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	ses.ns.gen++
	d.mu.Unlock()
	if err := d.saveGenerations(); err != nil {
		d.log.Error("kvtier store: clear: the generation was not saved; a restart would bring the cleared pages back", "err", err)
		return nil, status.Errorf(codes.Internal, "clear: %v", err)
	}
	return &pb.ClearReply{BootId: d.opt.BootID}, nil
}

// Snapshot returns the door's counters.
func (d *Door) Snapshot() *pb.StatsReply {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.st
	return &pb.StatsReply{BootId: d.opt.BootID, ExistsCalls: c.existsCalls, GetPages: c.getPages, HitPagesL2: c.hitL2, HitPagesL3: c.hitL3,
		MissPages: c.miss, CorruptPages: c.corrupt, TimeoutPages: c.timeout, SetPages: c.setPages, StoredPages: c.stored,
		ExistsPages: c.exists, NoSpacePages: c.noSpace, ReadBytes: c.readBytes, WrittenBytes: c.writtenBytes,
		L2UsedPages: uint64(d.nslots - len(d.free)), L2CapacityPages: uint64(d.nslots), EvictedPages: c.evict,
		PrefetchPages: c.prefetch, PrefetchSkippedPages: c.prefetchSkipped}
}

// Gauges are the door's point-in-time figures beyond Stats, for metrics.
type Gauges struct {
	Sessions, Leases, Loading, Quarantined, Entries int
	PutFailures, VerifyFailures                     uint64
}

// Gauges returns them.
func (d *Door) Gauges() Gauges {
	d.mu.Lock()
	defer d.mu.Unlock()
	return Gauges{Sessions: len(d.sessions), Leases: len(d.leases), Loading: d.loading, Quarantined: len(d.quarantine),
		Entries: len(d.entries), PutFailures: d.st.putFailures, VerifyFailures: d.st.verifyFailures}
}

// PendingPuts is the number of write-through batches not yet settled,
// plus the Commits whose checksums are being taken (their write-through
// is still to start), plus the pages whose gathered bytes are being
// verified: 0 means every committed, unpinned page is evictable.
func (d *Door) PendingPuts() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.puts) + len(d.commits) + len(d.gathered) + d.checking
}

// Stats returns the door's counters.
func (d *Door) Stats(_ context.Context, q *pb.StatsRequest) (*pb.StatsReply, error) {
	if _, err := d.session(q.GetSession()); err != nil {
		return nil, err
	}
	return d.Snapshot(), nil
}

// Close ends the session.
func (d *Door) Close(_ context.Context, q *pb.CloseRequest) (*pb.CloseReply, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.sessions[q.GetSession()]
	if s == nil {
		return nil, status.Errorf(codes.NotFound, "session %q: %v", q.GetSession(), errUnknownSession)
	}
	d.endSession(s)
	return &pb.CloseReply{}, nil
}

// Ping does nothing.
func (d *Door) Ping(context.Context, *pb.PingRequest) (*pb.PingReply, error) {
	return &pb.PingReply{}, nil
}

// check verifies the door's invariants (tests and fuzzing): every slot is
// exactly one of free, quarantined, loading, or held by one entry or one
// lease's detached pin; pins equal the leases' pins.
func (d *Door) check() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	owner := make([]string, d.nslots)
	claim := func(s int32, who string) error {
		if s < 0 || int(s) >= d.nslots {
			return fmt.Errorf("%s holds slot %d of %d", who, s, d.nslots)
		}
		if owner[s] != "" {
			return fmt.Errorf("slot %d held twice: %s and %s", s, owner[s], who)
		}
		owner[s] = who
		return nil
	}
	for _, s := range d.free {
		if err := claim(s, "free list"); err != nil {
			return err
		}
	}
	for _, q := range d.quarantine {
		if err := claim(q.slot, "quarantine"); err != nil {
			return err
		}
	}
	pins := map[*entry]int32{}
	seen := map[*entry]bool{}
	for h, e := range d.entries {
		if e.hash != h || e.dead {
			return fmt.Errorf("entry %s in the map is dead or misfiled", h.Short())
		}
		seen[e] = true
		if err := claim(e.slot, "entry "+h.Short()); err != nil {
			return err
		}
		if (e.node != 0) != (e.state == stCommitted) {
			return fmt.Errorf("entry %s: state %d with evictor node %d", h.Short(), e.state, e.node)
		}
	}
	for id, l := range d.leases {
		if l.ended || l.id != id || l.ses.leases[id] != l {
			return fmt.Errorf("lease %d misfiled", id)
		}
		for _, e := range l.pinned {
			if e != nil {
				pins[e]++
			}
		}
		for _, s := range l.detached {
			if err := claim(s, fmt.Sprintf("lease %d detached", id)); err != nil {
				return err
			}
		}
		for _, e := range l.res {
			if e != nil && (e.state != stReserved || d.entries[e.hash] != e) {
				return fmt.Errorf("lease %d reserves an entry that is not reserved in the map", id)
			}
		}
	}
	for e, n := range pins {
		if e.pins < n {
			return fmt.Errorf("entry %s: %d pins, leases hold %d", e.hash.Short(), e.pins, n)
		}
	}
	for e := range seen {
		if e.pins != pins[e] && d.loading == 0 {
			return fmt.Errorf("entry %s: %d pins, leases hold %d", e.hash.Short(), e.pins, pins[e])
		}
		if want := e.state == stCommitted && e.pins == 0 && e.putPending == 0; want != e.evictable {
			return fmt.Errorf("entry %s: evictable %v, want %v", e.hash.Short(), e.evictable, want)
		}
	}
	free := 0
	for _, o := range owner {
		if o == "" {
			free++
		}
	}
	// Unclaimed slots are held by reloads in flight or by dead entries a
	// store or a client still reads.
	if free < d.loading {
		return fmt.Errorf("%d slots unaccounted, %d loading", free, d.loading)
	}
	return nil
}

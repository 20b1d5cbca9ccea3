package pagestore

import (
	"context"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kvtier/kvtier/api/storev1"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

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
	// One deadline for the get's waits (its committing pages, the
	// prefetches of its pages, its own reload): each takes what is left.
	until := time.Now().Add(d.deadline(ctx, q.GetDeadlineMs()))
	// sumsFor: the hits' sums go out when the client checks them itself.
	sumsFor := func([]uint32) []uint32 { return nil }
	if q.GetClientVerifies() {
		sumsFor = func(c []uint32) []uint32 { return c }
	}
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
	var cand []int                 // keys the slab lacks: reloads, if the store holds them
	var prefetched []chan struct{} // the done of prefetches in flight of some of them
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
			out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_HIT, Tier: pb.Tier_TIER_L2, Spans: d.spansOf(e.slot), Sums: sumsFor(e.crc)}
			check = append(check, i)
			checkE, checkSlot, checkCRC = append(checkE, e), append(checkSlot, e.slot), append(checkCRC, e.crc)
			continue
		}
		if d.opt.Store == nil {
			out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_MISS}
			d.st.miss++
			continue
		}
		if r := d.reloading[hs[i]]; r != nil && r.abandoned && !slices.Contains(prefetched, r.done) {
			// A prefetch is reloading it: its page is installed before
			// its done closes, so the get waits for it below instead of
			// reading the page from the store a second time.
			prefetched = append(prefetched, r.done)
		}
		cand = append(cand, i)
	}
	d.mu.Unlock()
	if len(committing) > 0 {
		d.awaitCommitting(ctx, time.Until(until), l, hs, committing, ready, out, sumsFor)
	}
	if len(prefetched) > 0 {
		d.awaitClosed(ctx, time.Until(until), prefetched)
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
				out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_HIT, Tier: pb.Tier_TIER_L2, Spans: d.spansOf(e.slot), Sums: sumsFor(e.crc)}
				check = append(check, i)
				checkE, checkSlot, checkCRC = append(checkE, e), append(checkSlot, e.slot), append(checkCRC, e.crc)
				continue
			}
			if !held[j] {
				out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_MISS}
				d.st.miss++
				continue
			}
			if r := d.reloading[hs[i]]; r != nil && slices.Contains(prefetched, r.done) {
				// Its prefetch is still out after the get's wait: reading
				// it again would not land sooner.
				out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_TIMEOUT}
				d.st.timeout++
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
	// NB: a client that verifies reads every hit's bytes once, as it
	// copies them; the door then reads none (docs/store-api.md).
	verify := !d.opt.SkipVerify && !q.GetClientVerifies()
	if verify && len(check) > 0 && q.GetCheckAtRelease() {
		pc := d.startCheck(ses, l, keys, check, checkE, checkSlot, checkCRC)
		if d.afterStartCheck != nil {
			d.afterStartCheck(pc)
		}
	} else if verify && len(check) > 0 {
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
		d.awaitClosed(ctx, time.Until(until), []chan struct{}{ld.done})
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
				slot, crc := d.install(ld.hs[j], ld.slots[j], ld.crc[j], l, i)
				out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_HIT, Tier: pb.Tier_TIER_L3, Spans: d.spansOf(slot), Sums: sumsFor(crc)}
				d.st.hitL3++
				d.st.readBytes += uint64(d.pageBytes)
			}
		}
		d.mu.Unlock()
	}
	d.mu.Lock()
	// NB: a check at release counts as held even when it already dropped
	// every page it checked (a fast check, a slow reply): those pages went
	// out as hits, and only the lease's Release can report them corrupt.
	held := len(l.detached) > 0 || l.chk != nil
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

// awaitClosed waits, at most wait (and ctx, and the door's stop), until
// every channel of cs is closed.
func (d *Door) awaitClosed(ctx context.Context, wait time.Duration, cs []chan struct{}) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for _, c := range cs {
		select {
		case <-c:
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		case <-d.stop:
			return
		}
	}
}

// awaitCommitting waits (within the get's deadline) for the pages at
// positions committing, whose checksums their Commit is taking, and pins
// those that became readable as L2 hits: their checksums were just taken
// from these bytes, so they are not checked again.
func (d *Door) awaitCommitting(ctx context.Context, wait time.Duration, l *lease, hs []pagehash.Hash, committing []int, ready []chan struct{}, out *pb.GetReply, sumsFor func([]uint32) []uint32) {
	d.awaitClosed(ctx, wait, ready)
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
			out.Pages[i] = &pb.GetPage{Status: pb.GetStatus_GET_STATUS_HIT, Tier: pb.Tier_TIER_L2, Spans: d.spansOf(e.slot), Sums: sumsFor(e.crc)}
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
func (d *Door) startCheck(ses *session, l *lease, keys []string, check []int, es []*entry, slots []int32, crcs [][]uint32) *pendingCheck {
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
	return pc
}

// install makes a reloaded page readable (under d.mu) and, with a live
// lease l, pins it for key i; it returns the slot the page lies in and
// that page's checksums. A key
// that is already committed keeps its entry (the reloaded slot is freed);
// one that another client is setting pins the reloaded slot outside the
// map.
func (d *Door) install(h pagehash.Hash, slot int32, crc []uint32, l *lease, i int) (int32, []uint32) {
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
			return e.slot, e.crc
		}
		if pin {
			l.detached = append(l.detached, slot)
		} else {
			d.free = append(d.free, slot)
		}
		return slot, crc
	}
	e := &entry{hash: h, slot: slot, state: stCommitted, crc: crc}
	if pin {
		e.pins = 1
		l.pinned[i] = e
	}
	d.insert(e)
	return slot, crc
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
	d.mu.Lock()
	for _, h := range ld.hs {
		d.reloading[h] = ld
	}
	d.mu.Unlock()
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
		} else if d.storeKeepsSums {
			d.forgetMissed(ld, res)
		}
		d.forPages(len(ld.slots), func(j int) {
			if !ld.hit[j] {
				return
			}
			// The store's own sums, when it verified every kind against
			// one it keeps (GetRequest.HasSum): the page is not read again.
			crc := make([]uint32, nk)
			for k := range nk {
				r := batch[j*nk+k]
				if !r.HasSum {
					ld.crc[j] = d.checksum(ld.slots[j])
					return
				}
				crc[k] = r.Sum
			}
			ld.crc[j] = crc
		})
		d.mu.Lock()
		d.loading -= len(ld.slots)
		for _, h := range ld.hs {
			if d.reloading[h] == ld {
				delete(d.reloading, h)
			}
		}
		if ld.abandoned {
			for j := range ld.slots {
				if ld.hit[j] {
					_, _ = d.install(ld.hs[j], ld.slots[j], ld.crc[j], nil, 0)
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

// forgetMissed deletes from the store every kind of the reloaded pages
// that one of its kinds missed. The store listed them (LongestPrefix) but
// could not serve them whole: most often a copy that fails its checksum,
// such as one a client changed in the slab before a store that keeps the
// put's sums gathered it (the door no longer checks at the gather for
// those). Left there it would answer EXISTS to every set of the page and
// a miss to every get, until the store evicted it; deleted, the client's
// next set stores the page again. Absent keys are not an error.
func (d *Door) forgetMissed(ld *load, res []error) {
	nk := len(d.kinds)
	var del []tiers.Key
	for j := range ld.slots {
		missed := false
		for k := range nk {
			missed = missed || res[j*nk+k] != nil
		}
		if !missed {
			continue
		}
		for k := range nk {
			del = append(del, tiers.Key{Hash: ld.hs[j], Kind: tiers.PayloadKind(k)})
		}
	}
	if len(del) == 0 {
		return
	}
	if err := d.opt.Store.Delete(context.Background(), del); err != nil {
		d.log.Warn("kvtier store: deleting pages the store could not serve failed", "store", d.opt.StoreName, "pages", len(del)/nk, "err", err)
	}
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
	for j, i := range q.GetCorrupt() {
		if int(i) >= len(l.pinned) {
			return nil, status.Errorf(codes.InvalidArgument, "corrupt[%d]: position %d, the lease's BatchGet had %d keys (the lease is still held)", j, i, len(l.pinned))
		}
	}
	out := &pb.ReleaseReply{BootId: d.opt.BootID}
	d.dropReported(ses, l, q.GetCorrupt())
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

// dropReported, under d.mu, drops the pages at the positions (already
// range-checked) that a client_verifies get's client found corrupt as it
// copied them: no later get is served them, and their next set stores
// them again. A position whose page is not pinned by the lease (a miss, a
// reload of a key another client is setting, a page dropped already)
// has nothing to drop.
func (d *Door) dropReported(ses *session, l *lease, corrupt []uint32) {
	for _, i := range corrupt {
		e := l.pinned[i]
		if e == nil {
			continue
		}
		l.pinned[i] = nil
		e.pins--
		d.st.corrupt++
		d.st.verifyFailures++
		d.log.Error("kvtier store: a client's copy of a slab page failed its checksum: dropped", "session", ses.id, "position", i, "slot", e.slot)
		d.drop(e)
	}
}

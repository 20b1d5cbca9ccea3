package pagestore

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kvtier/kvtier/api/storev1"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

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
	sums := q.GetSums()
	nk := len(d.kinds)
	if len(sums) != 0 && len(sums) != len(l.status)*nk {
		d.mu.Unlock()
		return nil, status.Errorf(codes.InvalidArgument, "sums: %d entries, want none or %d (%d keys x %d payload kinds)", len(sums), len(l.status)*nk, len(l.status), nk)
	}
	// The lease is ours now: take it out, so expiry cannot free what we
	// commit.
	l.ended = true
	delete(d.leases, l.id)
	delete(ses.leases, l.id)
	var commit []*entry
	var at []int
	var crcs [][]uint32 // the client's sums per committed page (nil: none)
	for i, e := range l.res {
		if e == nil {
			continue
		}
		if written[i] {
			commit = append(commit, e)
			at = append(at, i)
			if len(sums) > 0 {
				crcs = append(crcs, append([]uint32(nil), sums[i*nk:(i+1)*nk]...))
			}
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
		// The checksums are taken off the call (unless the client gave
		// them): the client's copy is done and its backup thread goes
		// on; a get of these pages waits for them (ready), a set finds
		// them EXISTS, and a call that finds no free slot waits for them
		// too (waitCommits).
		done := make(chan struct{})
		d.mu.Lock()
		if d.commits == nil {
			d.commits = map[chan struct{}]struct{}{}
		}
		d.commits[done] = struct{}{}
		d.mu.Unlock()
		d.busy.Add(1) // NB: inside the Commit's own enter, as startLoad
		go d.finishCommit(commit, crcs, done)
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

// finishCommit takes committed pages' checksums (or, when crcs is not
// nil, the client's, unread), makes them readable and evictable, and
// starts their write-through with those checksums.
func (d *Door) finishCommit(commit []*entry, crcs [][]uint32, done chan struct{}) {
	defer d.busy.Done()
	if crcs == nil {
		crcs = make([][]uint32, len(commit))
		d.forPages(len(commit), func(j int) { crcs[j] = d.checksum(commit[j].slot) })
	}
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
				// The checksum travels with the page: a store that keeps
				// it (tiers.SumKeeper) stores it as given, never one of its
				// own over bytes that may have changed since.
				puts = append(puts, tiers.PutRequest{Key: tiers.Key{Hash: e.hash, Kind: tiers.PayloadKind(k)}, Src: d.span(e.slot, k),
					Sum: e.crc[k], HasSum: true})
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

package pagestore

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kvtier/kvtier/api/storev1"
)

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

package pagestore

import (
	"context"
	"slices"
	"time"

	pb "github.com/kvtier/kvtier/api/storev1"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

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
	d.mu.Lock()
	d.st.existsCalls++
	d.mu.Unlock()
	out := &pb.ExistsReply{BootId: d.opt.BootID}
	out.Tiers = d.tiersOf(ctx, hs[:n], nil)
	if q.GetPrefetch() {
		var l3 []pagehash.Hash
		for i, t := range out.Tiers {
			if t == pb.Tier_TIER_L3 {
				l3 = append(l3, hs[i])
			}
		}
		d.prefetch(l3)
	}
	if w := q.GetWaitMs(); w > 0 && d.waitReloads(ctx, hs, out.Tiers, w) {
		out.Tiers = d.tiersOf(ctx, hs[:n], out.Tiers[:0])
	}
	out.Present = uint32(len(out.Tiers))
	return out, nil
}

// tiersOf appends the tier of each leading page of hs that is stored: in
// the slab (committed), else in the store (every kind); it stops at the
// first page in neither.
func (d *Door) tiersOf(ctx context.Context, hs []pagehash.Hash, out []pb.Tier) []pb.Tier {
	n := len(hs)
	inL2 := make([]bool, n)
	d.mu.Lock()
	for i := range n {
		e := d.entries[hs[i]]
		inL2[i] = e != nil && (e.state == stCommitted || e.state == stCommitting)
	}
	d.mu.Unlock()
	for i := 0; i < n; {
		if inL2[i] {
			out = append(out, pb.Tier_TIER_L2)
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
			out = append(out, pb.Tier_TIER_L3)
		}
		i += m
		if i < j {
			break
		}
	}
	return out
}

// waitReloads waits, at most ms (and the limits' MaxDeadline, and ctx),
// for the reloads in flight of the pages ts places in L3 to land. It
// reports whether there were any: the tiers are then worth reading again.
func (d *Door) waitReloads(ctx context.Context, hs []pagehash.Hash, ts []pb.Tier, ms uint32) bool {
	var done []chan struct{}
	d.mu.Lock()
	for i, t := range ts {
		if t != pb.Tier_TIER_L3 {
			continue
		}
		if ld := d.reloading[hs[i]]; ld != nil && !slices.Contains(done, ld.done) {
			done = append(done, ld.done)
		}
	}
	if len(done) > 0 {
		d.st.existsWaits++
	}
	d.mu.Unlock()
	if len(done) == 0 {
		return false
	}
	d.awaitClosed(ctx, min(time.Duration(ms)*time.Millisecond, d.opt.Limits.MaxDeadline), done)
	return true
}

// prefetch starts reloading hs (pages the store holds) into the slab on a
// background load that installs them unpinned, as an abandoned BatchGet's
// load does. It never waits: a page with no free or evictable slot, or
// past the door's prefetch budget (a quarter of the slab loading at
// once), stays in L3 and is counted as skipped. A BatchGet of a page
// its prefetch is loading waits for that load (within the get's
// deadline) instead of reading the page from the store again.
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

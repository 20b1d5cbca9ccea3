package control

import (
	"fmt"
	"slices"

	"github.com/kvtier/kvtier/host/placement"
	"github.com/kvtier/kvtier/host/radix"
	"github.com/kvtier/kvtier/pagehash"
)

// startReload starts or joins the reload of a missed suffix: hashes[m0:]
// after the matched prefix. The request is held until the reload lands,
// fails, or its hold outlives ReloadTTL ticks. A reload of the same pages
// already in flight (same first page: the hash is prefix-chained, so it
// names the position) is joined, not duplicated; reloads in flight are
// capped.
//
// path is the match's walk: its nodes hold hashes[:m0], and the reload
// keeps their hash arrays rather than a copy of the prefix (reload.pre).
func (m *Machine) startReload(req ReqID, r *request, hashes []pagehash.Hash, m0 int, path []*radix.Node) {
	if !m.opts.L3 {
		return
	}
	if !m.l3Usable() {
		m.skip(Skip{Reason: SkipTierDown, Where: "reload", Req: req})
		return
	}
	key := hashes[m0]
	if rl := m.reloads[key]; rl != nil {
		rl.waiters = append(rl.waiters, req)
		m.hold(req, r, key)
		m.count(cReloadJoined)
		return
	}
	if len(m.reloads) >= m.opts.ReloadMaxInflight {
		m.skip(Skip{Reason: SkipCapacity, Where: "reload", Req: req, Pages: len(hashes) - m0})
		return
	}
	pre := make([][]pagehash.Hash, len(path))
	for i, n := range path {
		pre[i] = n.Hashes()
	}
	rl := &reload{key: key, pre: pre, suf: slices.Clone(hashes[m0:]), m: m0, waiters: []ReqID{req}}
	o := m.issue(opLookup, PipelineLookup)
	o.hashes, o.depth = rl.suf, m0
	o.reload = key
	rl.op = o.id
	m.reloads[key] = rl
	m.hold(req, r, key)
	m.out.lookups = append(m.out.lookups, Lookup{Op: o.id, Hashes: o.hashes, Depth: o.depth})
	m.count(cReloadLookup)
}

func (m *Machine) hold(req ReqID, r *request, key pagehash.Hash) {
	r.held, r.deadline, r.reload = true, m.tick+m.opts.ReloadTTL, key
	m.out.holds = append(m.out.holds, req)
}

// dropWaiter takes a request off its reload (finish, release, TTL); the
// reload goes on, and lands unrequested or is aborted then.
func (m *Machine) dropWaiter(req ReqID, r *request) {
	if rl := m.reloads[r.reload]; rl != nil {
		if i := slices.Index(rl.waiters, req); i >= 0 {
			rl.waiters = slices.Delete(rl.waiters, i, i+1)
		}
	}
	r.held, r.deadline, r.reload = false, 0, pagehash.Hash{}
}

// unholdAll releases every waiter of rl with reason and forgets rl.
func (m *Machine) unholdAll(rl *reload, reason HoldReason) {
	for _, w := range rl.waiters {
		if r := m.reqs[w]; r != nil {
			r.held, r.deadline, r.reload = false, 0, pagehash.Hash{}
		}
		m.out.unholds = append(m.out.unholds, Unhold{Req: w, Reason: reason})
	}
	delete(m.reloads, rl.key)
}

// applyLookup acts on the agreed durable count C of a lookup (the MIN of
// every rank's longest durable prefix): none is a miss; pages already in
// the tree (the same-tick duplicate recheck) release the waiters to
// re-match; otherwise an L2 object of exactly C pages is reserved through
// evict-to-fit and the get issued.
func (m *Machine) applyLookup(o *op, c int) {
	m.retire(o)
	rl := m.reloads[o.reload]
	switch {
	case len(rl.waiters) == 0 && !rl.prefetch:
		delete(m.reloads, rl.key)
		m.count(cReloadAbandoned)
		return
	case c == 0:
		if rl.prefetch {
			m.prefetchMissed(rl.key)
		}
		m.unholdAll(rl, Missed)
		m.count(cReloadMiss)
		return
	case m.present(rl.key):
		m.unholdAll(rl, Present)
		m.count(cReloadDuplicate)
		return
	case !m.l3Usable():
		m.skip(Skip{Reason: SkipTierDown, Where: "reload", Req: rl.firstWaiter()})
		m.unholdAll(rl, Missed)
		return
	}
	m.reloadN++
	obj := reloadObjectBase + placement.ObjectID(m.reloadN)
	if !m.reserveL2(obj, int64(c), 0, rl.firstWaiter(), "reload") {
		m.unholdAll(rl, Refused)
		return
	}
	g := m.issue(opReload, PipelineReload)
	g.obj, g.reload = obj, rl.key
	g.hashes, g.depth = rl.suf[:c], rl.m
	rl.c, rl.obj, rl.op = c, obj, g.id
	m.out.gets = append(m.out.gets, Get{Op: g.id, Hashes: g.hashes, Spans: m.pageSpans(obj, c), Depth: g.depth})
	m.count(cReloadGet)
}

// present reports whether a live node starts with page h.
func (m *Machine) present(h pagehash.Hash) bool {
	id, ok := m.first[h]
	if !ok {
		return false
	}
	n := m.tree.Node(id)
	return n != nil && n.Hashes()[0] == h
}

// applyReload lands a reload at the frontier: if it was read on every rank
// and still attaches cleanly — the matched prefix is still there and ends
// exactly where the reload starts — a node of exactly the C durable pages
// is inserted, L2 and L3 resident, on the committed object. Anything else
// frees the object and releases the waiters to recompute: a failure is a
// miss, never a hang.
func (m *Machine) applyReload(o *op, ok bool) error {
	m.retire(o)
	rl := m.reloads[o.reload]
	abort := func(reason HoldReason, what counter) error {
		if err := m.l2.Release(rl.obj); err != nil {
			return fmt.Errorf("control: free reload object %d: %w", rl.obj, err)
		}
		m.count(what)
		m.unholdAll(rl, reason)
		return nil
	}
	if !ok {
		m.skip(Skip{Reason: SkipFailed, Where: "reload", Op: o.id, Pages: rl.c})
		return abort(Missed, cReloadFailed)
	}
	if len(rl.waiters) == 0 && !rl.prefetch {
		return abort(Missed, cReloadAbortedNoWaiters)
	}
	want := rl.m + rl.c
	m.keyBuf = rl.appendKey(m.keyBuf[:0], want)
	path, got := m.tree.MatchHashes(m.keyBuf, m.pathB)
	m.pathB = path[:0]
	if err := m.settle(); err != nil {
		return err
	}
	switch {
	case got < rl.m:
		return abort(Missed, cReloadAnchorLost)
	case got > rl.m:
		return abort(Present, cReloadDuplicate)
	}
	anchor := m.tree.Root()
	if len(path) > 0 {
		anchor = path[len(path)-1]
	}
	last, added, err := m.tree.ExtendBorrowed(anchor, rl.suf[:rl.c])
	if err != nil {
		return fmt.Errorf("control: attach reload: %w", err)
	}
	if err := m.settle(); err != nil {
		return err
	}
	if added != rl.c {
		return fmt.Errorf("control: reload attached %d pages, reserved %d (bug)", added, rl.c)
	}
	k := m.marks.Get(last.ID())
	if err := m.l2.Commit(rl.obj); err != nil {
		return fmt.Errorf("control: commit reload object: %w", err)
	}
	m.setL2(last.ID(), k, rl.obj)
	m.setResidency(last, radix.L2|radix.L3)
	m.out.touches = append(m.out.touches, Touch{Hashes: o.hashes, Depth: o.depth})
	m.count(cReloadLanded)
	m.unholdAll(rl, Loaded)
	return nil
}

// expireHolds releases the requests whose hold outlived ReloadTTL ticks;
// their reload goes on and frees its reservation when it lands.
func (m *Machine) expireHolds() {
	// NB: a held request waits on a live reload (a reload leaves the map
	// only with no waiters or after unholding them all), so the waiters
	// are every hold: no need to walk every request each tick.
	if len(m.reloads) == 0 {
		return
	}
	ids := m.expireBuf[:0]
	for _, rl := range m.reloads {
		for _, w := range rl.waiters {
			if r := m.reqs[w]; r != nil && r.held && r.deadline <= m.tick {
				ids = append(ids, w)
			}
		}
	}
	slices.Sort(ids) // NB: the order of ReqIDs, as the map's is random
	ids = slices.Compact(ids)
	for _, id := range ids {
		m.dropWaiter(id, m.reqs[id])
		m.out.unholds = append(m.out.unholds, Unhold{Req: id, Reason: Expired})
		m.skip(Skip{Reason: SkipTTL, Where: "reload", Req: id})
	}
	m.expireBuf = ids[:0]
}

// firstWaiter is the request a reload's skips are charged to (0 for a
// prefetch nobody waits on yet).
func (rl *reload) firstWaiter() ReqID {
	if len(rl.waiters) == 0 {
		return 0
	}
	return rl.waiters[0]
}

// appendKey appends the reload's key up to page n (pre, then suf) to dst.
func (rl *reload) appendKey(dst []pagehash.Hash, n int) []pagehash.Hash {
	for _, seg := range rl.pre {
		if len(seg) >= n {
			return append(dst, seg[:n]...)
		}
		dst = append(dst, seg...)
		n -= len(seg)
	}
	return append(dst, rl.suf[:min(n, len(rl.suf))]...)
}

// keyLen is the length of the reload's key (the request's, at its match).
func (rl *reload) keyLen() int { return rl.m + len(rl.suf) }

package serve

import (
	"context"
	"errors"
	"fmt"
	"runtime/trace"
	"slices"
	"strconv"
	"time"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/host"
	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/host/consensus/enginegroup"
	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/internal/nsdigest"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

type stepErrs struct {
	out   *pb.StepReply
	stats *rankStats
}

// ref names an item of a step, formatted only when it is refused.
type ref struct {
	field string
	i     int // -1: the field itself
}

func (r ref) String() string {
	if r.i < 0 {
		return r.field
	}
	return r.field + "[" + strconv.Itoa(r.i) + "]"
}

func (e stepErrs) add(item ref, req string, code pb.ErrorCode, format string, args ...any) {
	e.out.Errors = append(e.out.Errors, &pb.ItemError{Item: item.String(), ReqId: req, Code: code, Message: fmt.Sprintf(format, args...)})
	if int(code) < len(e.stats.itemErrors) {
		e.stats.itemErrors[code].Add(1)
	}
}

// step runs one scheduler step of the session. It never panics on input
// and never changes state for a refused item. With one Machine for the
// node's ranks the step waits for the other ranks' (nodemachine.go).
func (r *rank) step(ctx context.Context, q *pb.StepRequest) *pb.StepReply {
	out, errs, eg, ok := r.stepStart(ctx, q)
	if !ok {
		return out
	}
	if r.srv.oneMachine() {
		return r.srv.stepTogether(ctx, r, q, out, errs)
	}
	r.stepCompletions(ctx, q, errs)
	return r.stepRest(ctx, q, out, errs, eg)
}

// stepStart checks the step's session, boot, number and size, and (the
// engine transport) completes the tick the last step started. ok false:
// the step was refused or the group stopped, and out says why.
func (r *rank) stepStart(ctx context.Context, q *pb.StepRequest) (out *pb.StepReply, errs stepErrs, eg *enginegroup.Member, ok bool) {
	out = &pb.StepReply{BootId: r.srv.boot, Tick: r.node.Ticks()}
	errs = stepErrs{out, &r.stats}
	s := r.sess
	switch {
	case s == nil || q.GetSession() != s.id:
		if why := r.srv.endedWhy(q.GetSession()); why != "" {
			errs.add(ref{"session", -1}, "", pb.ErrorCode_ERROR_CODE_UNKNOWN, "session %q ended: %s; register again", q.GetSession(), why)
			return out, errs, nil, false
		}
		errs.add(ref{"session", -1}, "", pb.ErrorCode_ERROR_CODE_UNKNOWN, "session %q is not open on rank %d: register again", q.GetSession(), r.idx)
		return out, errs, nil, false
	case q.GetBootId() != r.srv.boot:
		errs.add(ref{"boot_id", -1}, "", pb.ErrorCode_ERROR_CODE_STATE, "boot_id %q is stale: serve is %q since its restart; register again", q.GetBootId(), r.srv.boot)
		return out, errs, nil, false
	case q.GetStep() <= s.lastStep:
		errs.add(ref{"step", -1}, "", pb.ErrorCode_ERROR_CODE_STATE, "step %d does not follow step %d", q.GetStep(), s.lastStep)
		return out, errs, nil, false
	}
	items := len(q.GetCompletions()) + len(q.GetLookups()) + len(q.GetStores()) + len(q.GetFinished()) + len(q.GetAborted()) + len(q.GetUpcoming())
	if limit := r.srv.cfg.MaxItemsPerStep; items > limit {
		errs.add(ref{"step", -1}, "", pb.ErrorCode_ERROR_CODE_LIMIT, "%d items, at most %d a step", items, limit)
		return out, errs, nil, false
	}
	eg = r.engineMember()
	if eg != nil && r.tickDone != nil && len(q.GetFrontier()) == 0 {
		errs.add(ref{"frontier", -1}, "", pb.ErrorCode_ERROR_CODE_STATE,
			"tick %d waits for the engine's frontier: all-reduce the contributions the ranks' last steps returned and send it; nothing of this step was applied", r.node.Ticks())
		out.Contribution, _, _ = eg.PendingEncoded()
		return out, errs, nil, false
	}
	s.lastStep = q.GetStep()
	s.seen = time.Now()
	r.stats.steps.Add(1)
	switch {
	case eg == nil && len(q.GetFrontier()) > 0:
		errs.add(ref{"frontier", -1}, "", pb.ErrorCode_ERROR_CODE_INVALID, "this serve's group transport is %s, not the engine: send no frontier", r.srv.transport())
	case eg != nil && r.tickDone == nil && len(q.GetFrontier()) > 0:
		errs.add(ref{"frontier", -1}, "", pb.ErrorCode_ERROR_CODE_INVALID, "no tick waits for a frontier (the session's first step): send none")
	case eg != nil && r.tickDone != nil:
		// 0. The engine's frontier completes the tick the last step
		// started, before anything of this step applies.
		if err := r.finishTick(ctx, eg, q.GetFrontier()); err != nil {
			r.groupStopped(ctx, errs, ref{"frontier", -1}, err)
			return out, errs, nil, false
		}
	}
	return out, errs, eg, true
}

// stepCompletions applies the step's completions (to the rank's own
// Node) and fails the plans past their deadline.
func (r *rank) stepCompletions(ctx context.Context, q *pb.StepRequest, errs stepErrs) {
	// 1. Completions.
	seen := map[uint64]bool{}
	for i, c := range q.GetCompletions() {
		item := ref{"completions", i}
		id := tiers.BatchID(c.GetPlan())
		switch {
		case seen[c.GetPlan()]:
			errs.add(item, "", pb.ErrorCode_ERROR_CODE_DUPLICATE, "plan %d reported twice in the step", c.GetPlan())
			continue
		case !r.node.PlanOutstanding(id):
			errs.add(item, "", pb.ErrorCode_ERROR_CODE_UNKNOWN, "plan %d was never made or is already reported", c.GetPlan())
			continue
		}
		var why error
		if !c.GetOk() {
			why = errEngineFailed
		}
		err := r.node.CompletePlan(id, why, c.GetSums())
		if errors.Is(err, host.ErrPlanSums) {
			// A refused completion changes nothing: the plan stays
			// outstanding for a correct report.
			errs.add(ref{"completions[" + strconv.Itoa(i) + "].sums", -1}, "", pb.ErrorCode_ERROR_CODE_INVALID,
				"%v; the plan is not completed, report it again", err)
			continue
		}
		seen[c.GetPlan()] = true
		if err != nil {
			errs.add(item, "", pb.ErrorCode_ERROR_CODE_UNKNOWN, "plan %d: %v", c.GetPlan(), err)
		}
	}
	r.failOverdue(errs, time.Now())
}

// stepRest runs the rest of an accepted step: its lookups, stores, ends
// and hint, the tick, and the reply.
func (r *rank) stepRest(ctx context.Context, q *pb.StepRequest, out *pb.StepReply, errs stepErrs, eg *enginegroup.Member) *pb.StepReply {
	s := r.sess
	trace.WithRegion(ctx, "serve.step.drain", r.node.Drain)

	// 2. Lookups.
	names := map[string]bool{}
	for i, l := range q.GetLookups() {
		item := ref{"lookups", i}
		name := l.GetReqId()
		key, ok := r.checkKey(errs, item, name, l.GetPages(), l.GetHashes(), s)
		if !ok {
			continue
		}
		switch {
		case names[name]:
			errs.add(item, name, pb.ErrorCode_ERROR_CODE_DUPLICATE, "request id %q twice in the step's lookups", name)
			continue
		case s.reqs[name] != nil:
			errs.add(item, name, pb.ErrorCode_ERROR_CODE_DUPLICATE, "request id %q is already live (finish or abort it first)", name)
			continue
		}
		names[name] = true
		r.lookup(ctx, errs, item, s, name, key)
	}

	// 3. Stores.
	names = map[string]bool{}
	for i, st := range q.GetStores() {
		item := ref{"stores", i}
		name := st.GetReqId()
		key, ok := r.checkKey(errs, item, name, st.GetPages(), st.GetHashes(), s)
		if !ok {
			continue
		}
		rq := s.reqs[name]
		switch {
		case names[name]:
			errs.add(item, name, pb.ErrorCode_ERROR_CODE_DUPLICATE, "request id %q twice in the step's stores", name)
			continue
		case rq == nil:
			errs.add(item, name, pb.ErrorCode_ERROR_CODE_UNKNOWN, "request %q was never looked up (or is finished)", name)
			continue
		case !rq.done:
			errs.add(item, name, pb.ErrorCode_ERROR_CODE_STATE, "request %q: its lookup is still pending; store after it is DONE", name)
			continue
		}
		names[name] = true
		r.store(ctx, errs, item, rq, key, out)
	}

	// 4. Finished and aborted.
	names = map[string]bool{}
	for i, f := range q.GetFinished() {
		r.end(ctx, errs, ref{"finished", i}, s, names, f.GetReqId(), true)
	}
	for i, a := range q.GetAborted() {
		r.end(ctx, errs, ref{"aborted", i}, s, names, a.GetReqId(), false)
	}

	// 5. The waiting queue as a hint, after this step's admissions.
	r.upcoming(ctx, errs, s, q.GetUpcoming())

	if eg != nil {
		return r.stepEngine(ctx, eg, s, out, errs)
	}

	// 6. Tick, once: the frontier commits what finished. The step never
	// waits for a tier: lookups and reloads run on the Node's store
	// worker, and a request held for one stays PENDING until a later
	// step's tick finds its answers in the frontier.
	reg := trace.StartRegion(ctx, "serve.step.tick")
	err := r.tick(ctx)
	reg.End()
	if err != nil {
		// The group stopped (a rank's engine did not step in time, or
		// the ranks diverged, or a peer's session ended): every session
		// ends, a new epoch starts; the engine registers again and
		// recomputes what was pending.
		r.groupStopped(ctx, errs, ref{"step", -1}, err)
		return out
	}

	r.finishStep(s, out)
	r.contribution(out)
	return out
}

// contribution puts the rank's contribution to its next tick in the
// reply, in the wire encoding the engine transport's replies carry
// (stepEngine), so every reply has one format. Serve exchanges this one
// itself: the envelope's group and stack ids are 0, and the bytes are
// for the engine's logs and tools (kvtier.group.reduce_contributions
// reads them), never a frontier to send back.
func (r *rank) contribution(out *pb.StepReply) {
	enc, err := r.node.AppendContribution(nil, consensus.Envelope{Rank: r.srv.groupRank(r.idx), Size: r.srv.world()})
	if err != nil {
		r.log.Error("kvtier serve: encode the contribution", "tick", r.node.Ticks(), "err", err)
		return
	}
	out.Contribution = enc
}

// groupStopped ends the session after its tick failed. When another
// rank's session ended while this rank waited in the exchange, a new
// epoch already started: the reply names that rank and why, and the rank
// joins the epoch. Otherwise the group stopped (a rank's engine did not
// step in time, or the ranks diverged): every session ends, a new epoch
// starts. Either way the engine registers again and recomputes what was
// pending.
func (r *rank) groupStopped(ctx context.Context, errs stepErrs, item ref, err error) {
	if se := (*sessionEnded)(nil); errors.As(err, &se) && r.srv.current().n > r.epoch.n {
		errs.add(item, "", pb.ErrorCode_ERROR_CODE_UNAVAILABLE, "%v; register again", se)
		r.catchUp(ctx)
		return
	}
	errs.add(item, "", pb.ErrorCode_ERROR_CODE_UNAVAILABLE, "tick: %v; the session ended, register again", err)
	r.stopErr = err
	r.stats.groupStopped.Add(1)
	r.endSession(ctx, "group stopped: "+err.Error())
}

// finishStep adds what the step's tick(s) made ready: the lookups that
// finished, the copy plans, the tick and, every DigestEvery ticks, the
// digest.
//
// A reply carries at most one result per req_id: a lookup of this step
// that was PENDING after its match and is ready now has its PENDING
// result replaced, in place, by the DONE one.
func (r *rank) finishStep(s *session, out *pb.StepReply) {
	var pending map[string]int // req_id -> index of its PENDING result in out
	for _, name := range r.pendingNames(s) {
		rq := s.reqs[name]
		if !r.ready(rq) {
			continue
		}
		if pending == nil {
			pending = map[string]int{}
			for i, l := range out.Lookups {
				if l.GetStatus() == pb.LookupStatus_LOOKUP_STATUS_PENDING {
					pending[l.GetReqId()] = i
				}
			}
		}
		if i, ok := pending[name]; ok {
			out.Lookups[i] = r.result(rq)
			continue
		}
		out.Lookups = append(out.Lookups, r.result(rq))
	}
	r.finishPlans(out)
}

// finishPlans adds the rank's own part of a reply: its copy plans, the
// tick and, every DigestEvery ticks, the digest.
func (r *rank) finishPlans(out *pb.StepReply) {
	r.ownPlans(out)
	out.Tick = r.node.Ticks()
	if d, ok := r.node.DueDigest(); ok {
		out.Digest = d[:]
		if r.epoch == nil || r.epoch.members == nil || r.srv.oneMachine() {
			// A rank of one offers its digest to the engine only; a
			// group's exchange counts its own (timedGroup).
			r.stats.digests.Add(1)
		}
	}
}

// ownPlans adds the copy plans the rank's pool made since its last reply
// and notes when they went out (the plan deadline).
func (r *rank) ownPlans(out *pb.StepReply) {
	r.plans = r.node.TakePlans(r.plans[:0])
	out.Plans = planMsgs(out.Plans, r.plans)
	if len(out.Plans) > 0 {
		now := time.Now()
		if r.planSent == nil {
			r.planSent = map[tiers.BatchID]time.Time{}
		}
		for _, p := range out.Plans {
			r.planSent[tiers.BatchID(p.Plan)] = now
		}
	}
}

// errPlanOverdue fails a plan the engine did not report in time.
var errPlanOverdue = errors.New("the engine did not report the plan within the plan deadline")

// failOverdue fails every plan still outstanding PlanTimeout after the
// reply that carried it went out: the pool acks its items failed, so the
// Machine rolls the copies back at the next tick and the plan's L1 pages
// are free again. Each one is named in the reply (item "plan:N",
// UNAVAILABLE); a later completion of it is UNKNOWN.
func (r *rank) failOverdue(errs stepErrs, now time.Time) {
	if len(r.planSent) == 0 {
		return
	}
	var late []tiers.BatchID
	for id, at := range r.planSent {
		switch {
		case !r.node.PlanOutstanding(id):
			delete(r.planSent, id)
		case now.Sub(at) > r.srv.cfg.PlanTimeout:
			late = append(late, id)
		}
	}
	slices.Sort(late)
	for _, id := range late {
		delete(r.planSent, id)
		if err := r.node.CompletePlan(id, errPlanOverdue, nil); err != nil {
			continue // reported or failed meanwhile
		}
		r.stats.overduePlans.Add(1)
		r.log.Warn("kvtier serve: plan overdue; failed and rolled back", "plan", uint64(id), "timeout", r.srv.cfg.PlanTimeout)
		errs.add(ref{"plan:" + strconv.FormatUint(uint64(id), 10), -1}, "", pb.ErrorCode_ERROR_CODE_UNAVAILABLE,
			"plan %d was not reported within %v: serve failed it and rolls its copies back; do not run it, and do not report it (a late completion is UNKNOWN)", uint64(id), r.srv.cfg.PlanTimeout)
	}
}

// pendingNames lists the session's requests whose lookup is not yet sent
// DONE, in a total order.
func (r *rank) pendingNames(s *session) []string {
	var ns []string
	for name, rq := range s.reqs {
		if !rq.done {
			ns = append(ns, name)
		}
	}
	slices.Sort(ns)
	return ns
}

// upcoming applies a step's waiting-queue hint (StepRequest.upcoming):
// once the session has sent one, the last is cleared and the new keys
// applied, nearest first. A bad key is refused alone; a list longer than
// control.MaxUpcoming is refused whole (the last hint is cleared).
func (r *rank) upcoming(ctx context.Context, errs stepErrs, s *session, ups []*pb.Upcoming) {
	if len(ups) == 0 && !s.hinted {
		return
	}
	s.hinted = true
	apply := func(item ref, key []pagehash.Hash) bool {
		if _, err := r.node.Apply(ctx, control.Event{Kind: control.EvUpcoming, Pages: len(key), Hashes: key}); err != nil {
			errs.add(item, "", pb.ErrorCode_ERROR_CODE_UNAVAILABLE, "upcoming: %v", err)
			return false
		}
		return true
	}
	if !apply(ref{"upcoming", -1}, nil) {
		return
	}
	if len(ups) > control.MaxUpcoming {
		errs.add(ref{"upcoming", -1}, "", pb.ErrorCode_ERROR_CODE_LIMIT, "%d upcoming keys, at most %d (the nearest of the queue)", len(ups), control.MaxUpcoming)
		return
	}
	for i, u := range ups {
		item := ref{"upcoming", i}
		pages := u.GetPages()
		switch {
		case pages == 0:
			errs.add(item, "", pb.ErrorCode_ERROR_CODE_INVALID, "no pages")
			continue
		case int(pages) > r.srv.cfg.MaxPagesPerRequest:
			errs.add(item, "", pb.ErrorCode_ERROR_CODE_LIMIT, "%d pages, at most %d a request", pages, r.srv.cfg.MaxPagesPerRequest)
			continue
		}
		key, err := s.keyer.keys(nil, pages, u.GetHashes())
		if err != nil {
			errs.add(item, "", pb.ErrorCode_ERROR_CODE_INVALID, "%v", err)
			continue
		}
		if !apply(item, key) {
			return
		}
	}
}

// checkKey validates an item's id and hashes and returns serve's keys.
func (r *rank) checkKey(errs stepErrs, item ref, name string, pages uint32, hashes []byte, s *session) ([]pagehash.Hash, bool) {
	switch {
	case name == "":
		errs.add(item, name, pb.ErrorCode_ERROR_CODE_INVALID, "empty req_id")
		return nil, false
	case len(name) > nsdigest.MaxString:
		errs.add(item, "", pb.ErrorCode_ERROR_CODE_INVALID, "req_id of %d bytes, at most %d", len(name), nsdigest.MaxString)
		return nil, false
	case pages == 0:
		errs.add(item, name, pb.ErrorCode_ERROR_CODE_INVALID, "no pages")
		return nil, false
	case int(pages) > r.srv.cfg.MaxPagesPerRequest:
		errs.add(item, name, pb.ErrorCode_ERROR_CODE_LIMIT, "%d pages, at most %d a request", pages, r.srv.cfg.MaxPagesPerRequest)
		return nil, false
	}
	key, err := s.keyer.keys(nil, pages, hashes)
	if err != nil {
		errs.add(item, name, pb.ErrorCode_ERROR_CODE_INVALID, "%v", err)
		return nil, false
	}
	return key, true
}

// lookup matches a new request's key.
func (r *rank) lookup(ctx context.Context, errs stepErrs, item ref, s *session, name string, key []pagehash.Hash) {
	r.nextReq++
	rq := &request{name: name, id: r.nextReq, key: key}
	rd, err := r.node.Apply(ctx, control.Event{Kind: control.EvMatch, Req: rq.id, Pages: len(key), Hashes: key})
	if err != nil {
		errs.add(item, name, pb.ErrorCode_ERROR_CODE_UNAVAILABLE, "lookup: %v", err)
		// The Machine refused it whole; make sure no lock stays.
		_, _ = r.node.Apply(ctx, control.Event{Kind: control.EvRelease, Req: rq.id})
		return
	}
	r.stats.lookups.Add(1)
	if r.idx == 0 {
		r.srv.rec.Record(time.Now(), key)
		r.srv.shadow.Take(key)
	}
	s.reqs[name] = rq
	r.byID[rq.id] = rq
	if len(rd.Matches) > 0 {
		rq.first = rd.Matches[len(rd.Matches)-1]
		rq.res = rq.first
		rq.held = rq.first.Held
	}
	r.unholds(ctx, rd.Unholds)
	if r.ready(rq) {
		errs.out.Lookups = append(errs.out.Lookups, r.result(rq))
	} else {
		errs.out.Lookups = append(errs.out.Lookups, &pb.LookupResult{ReqId: name, Status: pb.LookupStatus_LOOKUP_STATUS_PENDING})
	}
}

// unholds handles released holds: a reload that landed re-matches once
// (loading the pages back into L1); any other reason ends the wait.
func (r *rank) unholds(ctx context.Context, us []control.Unhold) {
	for _, u := range us {
		rq := r.byID[u.Req]
		if rq == nil {
			continue
		}
		rq.held = false
		if rq.rematched || (u.Reason != control.Loaded && u.Reason != control.Present) {
			continue
		}
		rq.rematched = true
		rd, err := r.node.Apply(ctx, control.Event{Kind: control.EvMatch, Req: rq.id, Pages: len(rq.key), Hashes: rq.key})
		if err != nil {
			r.log.Warn("kvtier serve: re-match after a reload", "req", rq.name, "err", err)
			continue
		}
		if len(rd.Matches) > 0 {
			rq.res = rd.Matches[len(rd.Matches)-1]
			rq.held = rq.res.Held
		}
		r.unholds(ctx, rd.Unholds)
	}
}

// ready reports whether a lookup is done: not held for a reload and no
// load-back in flight on its path. Both are replicated state, so every
// rank of a group answers DONE in the same step.
func (r *rank) ready(rq *request) bool { return !rq.held && !r.node.Loading(rq.id) }

// result is a DONE lookup result: the hit prefix readable in L1 now.
func (r *rank) result(rq *request) *pb.LookupResult {
	rq.done = true
	r.refs = r.node.MatchedL1(rq.id, r.refs[:0])
	got := len(r.refs)
	res := &pb.LookupResult{ReqId: rq.name, Status: pb.LookupStatus_LOOKUP_STATUS_DONE, HitPages: uint32(got)}
	l1 := min(rq.first.L1, got)
	l2 := min(rq.first.L2, got-l1)
	res.L1Hit, res.L2Hit, res.L3Hit = uint32(l1), uint32(l2), uint32(got-l1-l2)
	for _, ref := range r.refs {
		p := uint32(ref.L1)
		if n := len(res.L1Pages); n > 0 && res.L1Pages[n-1].Start+res.L1Pages[n-1].Count == p {
			res.L1Pages[n-1].Count++
			continue
		}
		res.L1Pages = append(res.L1Pages, &pb.PageRange{Start: p, Count: 1})
	}
	r.stats.hitPages.Add(int64(got))
	r.stats.missPages.Add(int64(len(rq.key) - got))
	r.stats.hitByTier[1].Add(int64(l1))
	r.stats.hitByTier[2].Add(int64(l2))
	r.stats.hitByTier[3].Add(int64(got - l1 - l2))
	return res
}

// store inserts a request's whole key and returns its placement.
func (r *rank) store(ctx context.Context, errs stepErrs, item ref, rq *request, key []pagehash.Hash, out *pb.StepReply) {
	rd, err := r.node.Apply(ctx, control.Event{Kind: control.EvInsert, Req: rq.id, Pages: len(key), Hashes: key})
	if err != nil {
		errs.add(item, rq.name, pb.ErrorCode_ERROR_CODE_UNAVAILABLE, "store: %v", err)
		return
	}
	r.stats.stores.Add(1)
	placed := false
	for _, p := range rd.Placements {
		if p.Req != rq.id {
			continue
		}
		n := int64(0)
		pm := &pb.Placement{ReqId: rq.name}
		for _, rg := range p.L1 {
			pm.L1Pages = append(pm.L1Pages, &pb.PageRange{Start: uint32(rg.Start), Count: uint32(rg.Pages)})
			n += rg.Pages
		}
		pm.FirstPage = uint32(int64(len(key)) - n)
		out.Placements = append(out.Placements, pm)
		r.stats.placedPages.Add(n)
		placed = true
	}
	if !placed {
		r.stats.refusedStores.Add(1)
	}
	r.unholds(ctx, rd.Unholds)
}

// end finishes or aborts a request.
func (r *rank) end(ctx context.Context, errs stepErrs, item ref, s *session, names map[string]bool, name string, finish bool) {
	rq := s.reqs[name]
	switch {
	case name == "":
		errs.add(item, name, pb.ErrorCode_ERROR_CODE_INVALID, "empty req_id")
		return
	case names[name]:
		errs.add(item, name, pb.ErrorCode_ERROR_CODE_DUPLICATE, "request %q ended twice in the step", name)
		return
	case rq == nil:
		errs.add(item, name, pb.ErrorCode_ERROR_CODE_UNKNOWN, "request %q is not live (never looked up, or already ended)", name)
		return
	}
	names[name] = true
	if finish {
		if _, err := r.node.Apply(ctx, control.Event{Kind: control.EvFinish, Req: rq.id}); err != nil {
			r.log.Error("kvtier serve: finish", "req", name, "err", err)
		}
	}
	if _, err := r.node.Apply(ctx, control.Event{Kind: control.EvRelease, Req: rq.id}); err != nil {
		r.log.Error("kvtier serve: release", "req", name, "err", err)
	}
	delete(s.reqs, name)
	delete(r.byID, rq.id)
}

// tick exchanges and ticks the Machine and handles the holds it releases.
func (r *rank) tick(ctx context.Context) error {
	rd, err := r.node.Tick(ctx)
	if err != nil {
		r.log.Error("kvtier serve: tick", "epoch", r.epoch.n, "err", err)
		return err
	}
	r.unholds(ctx, rd.Unholds)
	return nil
}

// planMsgs groups planned copies (in plan order, a batch's items
// together) into one CopyPlan per batch. The items are cut from one
// array and each plan's list is sized once: a step plans a copy item a
// page, kind and rank.
func planMsgs(dst []*pb.CopyPlan, pcs []host.PlannedCopy) []*pb.CopyPlan {
	if len(pcs) == 0 {
		return dst
	}
	items := make([]pb.CopyItem, len(pcs))
	var m *pb.CopyPlan
	for i, pc := range pcs {
		if i == 0 || pcs[i-1].Batch != pc.Batch {
			n := 1
			for i+n < len(pcs) && pcs[i+n].Batch == pc.Batch {
				n++
			}
			m = &pb.CopyPlan{Plan: uint64(pc.Batch), Direction: pb.Direction_DIRECTION_FROM_SLAB, Items: make([]*pb.CopyItem, 0, n)}
			if pc.ToSlab {
				m.Direction = pb.Direction_DIRECTION_TO_SLAB
			}
			dst = append(dst, m)
		}
		c, it := pc.Copy, &items[i]
		it.L1Page, it.Kind, it.Slab = uint32(c.Page), uint32(c.Kind), uint32(c.Span.Slab)
		it.Offset, it.Length = uint64(c.Span.Offset), uint64(c.Span.Length)
		m.Items = append(m.Items, it)
	}
	return dst
}

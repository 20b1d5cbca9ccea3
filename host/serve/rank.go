package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/host"
	"github.com/kvtier/kvtier/host/consensus/enginegroup"
	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/host/stack"
	"github.com/kvtier/kvtier/internal/nsdigest"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l1cuda"
)

// rank hosts one rank: its stack, Node and Machine, and the session of
// the engine rank that talks to it. One goroutine (loop) owns all of it.
type rank struct {
	idx   int
	srv   *Server
	st    *stack.Stack
	node  *host.Node
	m     *control.Machine
	pool  *l1cuda.EnginePool
	plans []l1cuda.PlannedCopy // reused by step
	log   *slog.Logger
	calls chan call
	// closeHook closes stores a test's Config.Stores put in (nil: none).
	closeHook func() error

	sess    *session
	nextReq control.ReqID
	byID    map[control.ReqID]*request
	refs    []control.PageRef

	// mo and nodeOpts rebuild the Machine and Node for a new epoch.
	mo       control.Options
	nodeOpts host.Options
	// epoch is the group epoch the rank's Machine runs in.
	epoch *epoch
	// broken: the rank could not start a new epoch; it refuses sessions.
	broken error

	snap  atomic.Pointer[snapshot]
	stats rankStats
	// past sums the counters of the Nodes and Machines of the rank's
	// earlier epochs (see retire), so the metrics never go back.
	past epochTotals
	// planSent holds when each copy plan went out in a reply (for the
	// plan deadline, Config.PlanTimeout); a plan no longer outstanding is
	// dropped at the next check.
	planSent map[tiers.BatchID]time.Time

	// tickDone is set while a tick waits for the engine's frontier
	// (group transport engine): its goroutine sits in the exchange, and
	// nothing else touches the Node until finishTick or abortTick.
	tickDone   chan tickResult
	tickCancel context.CancelFunc

	// exchanging counts the rank's goroutines in the group exchange now
	// (0 or 1; a test waits for a rank to be there).
	exchanging atomic.Int32
}

type tickResult struct {
	rd  control.Ready
	err error
}

// rankStats are the counters the metrics read (atomics: the rank writes,
// a scrape reads).
type rankStats struct {
	steps, sessions, expired, replaced atomic.Int64
	disconnected, closed               atomic.Int64
	lookups, hitPages, missPages       atomic.Int64
	hitByTier                          [4]atomic.Int64
	stores, placedPages, refusedStores atomic.Int64
	itemErrors                         [8]atomic.Int64 // by pb.ErrorCode
	rolledBack                         atomic.Int64
	digests                            atomic.Int64

	// groupStopped: the session ended because its group stopped (a tick
	// failed: a peer timed out or left, a digest mismatch, a bad
	// frontier); groupEnded: another rank's session ended and took this
	// one with it (the engine's ranks are one unit).
	groupStopped, groupEnded atomic.Int64
	// mismatches counts exchanges that failed on differing digests.
	mismatches atomic.Int64
	// overduePlans counts plans failed by the plan deadline.
	overduePlans atomic.Int64
}

// session is the engine rank connected to this rank.
type session struct {
	id       string
	engineID string
	ns       *pb.Namespace
	keyer    keyer
	lastStep uint64
	seen     time.Time
	reqs     map[string]*request
	// hinted: the session has sent an upcoming list; from then on every
	// step's list replaces the last.
	hinted bool
}

// request is one live request of the session.
type request struct {
	name      string
	id        control.ReqID
	key       []pagehash.Hash
	first     control.MatchResult
	res       control.MatchResult
	held      bool
	rematched bool
	done      bool // its lookup result was sent DONE
}

type callKind uint8

const (
	callRegister callKind = iota + 1
	callStep
	callClose
	// callDrop ends a session whose connection closed.
	callDrop
	// callEpoch moves the rank to a new epoch another rank started.
	callEpoch
)

// closeMsg names a session to drop and why.
type closeMsg struct {
	session, why string
}

type call struct {
	kind  callKind
	reg   *pb.RegisterRequest
	step  *pb.StepRequest
	close *pb.CloseRequest
	drop  *closeMsg
	epoch *epoch
	reply chan callReply
}

type callReply struct {
	reg  *pb.RegisterReply
	step *pb.StepReply
	err  error
}

func newSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// loop serves calls until ctx ends, draining tier acks and store results
// as they arrive and expiring a silent session.
func (r *rank) loop(ctx context.Context) {
	var storeReady <-chan struct{}
	if len(r.st.Stores) > 0 {
		storeReady = r.st.Stores[0].Store.AckReady()
	}
	expire := time.NewTicker(expireEvery(r.srv.cfg.SessionTTL))
	defer expire.Stop()
	r.publish()
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-r.calls:
			var out callReply
			// Nothing of a call applies to the Machine of an epoch that
			// ended: the rank moves to the current one first.
			r.catchUp(ctx)
			switch c.kind {
			case callRegister:
				out.reg, out.err = r.register(ctx, c.reg)
			case callStep:
				t0 := time.Now()
				out.step = r.step(ctx, c.step)
				r.srv.metrics.observeStep(r.idx, time.Since(t0))
			case callClose:
				out.err = r.closeSession(ctx, c.close)
			case callDrop:
				if r.sess != nil && r.sess.id == c.drop.session {
					r.stats.disconnected.Add(1)
					r.endSession(ctx, c.drop.why)
				}
			case callEpoch:
				// catchUp moved the rank to c.epoch or a later one.
			}
			r.publish()
			c.reply <- out // buffered: never blocks
		case <-storeReady:
			// NB: while a tick waits for the engine's frontier its
			// goroutine owns the Node; it drains when it resumes.
			if r.tickDone == nil {
				r.node.Drain()
			}
		case <-r.pool.AckReady():
			if r.tickDone == nil {
				r.node.Drain()
			}
		case <-r.node.StoreReady():
			// The Node's store worker answered a lookup or a get: its
			// result is a local fact, replicated at the next tick.
			if r.tickDone == nil {
				r.node.Drain()
			}
		case now := <-expire.C:
			if s := r.sess; s != nil && now.Sub(s.seen) > r.srv.cfg.SessionTTL {
				r.log.Warn("kvtier serve: session expired", "session", s.id, "engine", s.engineID, "silent", now.Sub(s.seen).Round(time.Millisecond))
				r.stats.expired.Add(1)
				r.endSession(ctx, "expired")
				r.publish()
			}
		}
	}
}

// expireEvery is how often the rank looks for a silent session: a
// quarter of the TTL, at most a second.
func expireEvery(ttl time.Duration) time.Duration {
	return min(time.Second, max(ttl/4, 10*time.Millisecond))
}

// catchUp moves the rank to the server's current epoch when a later one
// started (another rank's session ended): its session, of the old epoch,
// ends saying why, and a new Machine starts. Every call runs it first,
// so a rank never applies a new session's step to an old Machine, and
// every rank's Machine of an epoch starts from the same state: a fresh
// Machine, request ids from 1, before any of the epoch's events.
func (r *rank) catchUp(ctx context.Context) {
	e := r.srv.current()
	if r.epoch.n >= e.n {
		return
	}
	why := "a new group epoch started"
	if e.why != nil {
		why = e.why.Error()
	}
	if s := r.sess; s != nil {
		r.stats.groupEnded.Add(1)
		r.log.Info("kvtier serve: session ended with its group", "session", s.id, "why", why, "epoch", e.n)
	}
	r.dropSession(why)
	r.reset(ctx, e, why)
}

// register opens a session, replacing an earlier one.
func (r *rank) register(ctx context.Context, q *pb.RegisterRequest) (*pb.RegisterReply, error) {
	if r.broken != nil {
		return nil, r.broken
	}
	if err := checkNamespace(q.GetNamespace(), r.st.Config.Payload); err != nil {
		return nil, err
	}
	if r.sess != nil {
		r.log.Info("kvtier serve: session replaced", "old", r.sess.id, "engine", q.GetEngineId())
		r.stats.replaced.Add(1)
		r.endSession(ctx, "replaced by a new Register")
	}
	ns := q.GetNamespace()
	s := &session{id: newSessionID(), engineID: q.GetEngineId(), ns: ns, keyer: keyer(keyNamespace(ns)), seen: time.Now(), reqs: map[string]*request{}}
	r.sess = s
	r.srv.bind(s.id, r)
	r.stats.sessions.Add(1)
	r.log.Info("kvtier serve: session registered", "session", s.id, "engine", s.engineID, "model", ns.GetModel(), "shard", ns.GetShard())
	return r.srv.registerReply(r, s), nil
}

func (r *rank) closeSession(ctx context.Context, q *pb.CloseRequest) error {
	if r.sess == nil || r.sess.id != q.GetSession() {
		if why := r.srv.endedWhy(q.GetSession()); why != "" {
			return fmt.Errorf("session %q: %w: it ended: %s", q.GetSession(), errUnknownSession, why)
		}
		return fmt.Errorf("session %q: %w", q.GetSession(), errUnknownSession)
	}
	if q.GetBootId() != r.srv.boot {
		return fmt.Errorf("boot_id %q: serve is %q: %w", q.GetBootId(), r.srv.boot, errStaleBoot)
	}
	r.stats.closed.Add(1)
	r.endSession(ctx, "closed")
	return nil
}

// endSession ends the rank's session: its owed plans are failed, and the
// rank starts a new group epoch with a new Machine over the same tiers
// (see reset), because the L1 was the engine's memory and the next engine
// starts with an empty one. With more than one rank, every rank moves to
// the new epoch: the engine's ranks are one unit.
func (r *rank) endSession(ctx context.Context, why string) {
	s := r.sess
	if r.srv.cfg.Group == GroupTCP {
		// The group's Machines start over together only by a restart of
		// every rank's process (Config.GroupRank): refuse sessions and
		// end Serve, saying why.
		r.dropSession(why)
		err := fmt.Errorf("rank %d: %s: %w", r.srv.groupRank(r.idx), why, errTCPRestart)
		if r.broken == nil {
			r.broken = fmt.Errorf("%w: %w", err, errBroken)
			r.log.Error("kvtier serve: the tcp rank group ended", "group_rank", r.srv.groupRank(r.idx), "why", why)
		}
		r.srv.stop(err)
		return
	}
	r.dropSession(why)
	e := r.srv.advance(r.epoch.n, &sessionEnded{rank: r.srv.groupRank(r.idx), why: why})
	r.reset(ctx, e, why)
	r.srv.broadcast(e, r.idx)
	if s != nil {
		r.log.Info("kvtier serve: session ended", "session", s.id, "why", why, "epoch", e.n)
	}
}

// dropSession forgets the session (remembering why it ended) and fails
// the plans it owed.
func (r *rank) dropSession(why string) {
	r.abortTick()
	if s := r.sess; s != nil {
		r.srv.unbind(s.id, why)
		r.sess = nil
	}
	n := r.pool.FailPending(fmt.Errorf("the session ended before reporting the plan"))
	r.stats.rolledBack.Add(int64(n))
	r.node.Drain()
}

// reset moves the rank to epoch e: it waits (bounded) for the old
// Machine's store operations, so no put still reads a slab span the new
// Machine will reuse, and builds a new Machine and Node over the same
// stack. Pages durable in L3 are found again by lookups (cold).
func (r *rank) reset(ctx context.Context, e *epoch, why string) {
	if r.epoch == e {
		return
	}
	r.abortTick()
	if err := r.node.Settle(ctx); err != nil {
		r.log.Error("kvtier serve: settle before a new epoch", "err", err)
	}
	if r.node.Outstanding() > 0 {
		r.log.Warn("kvtier serve: store operations abandoned at a new epoch", "batches", r.node.Outstanding())
	}
	// NB: Close waits (bounded) for a Get still writing into a slab span
	// of the old Machine's reload, which the new Machine may reuse; the
	// old Node's late results go nowhere.
	if err := r.node.Close(); err != nil {
		r.log.Error("kvtier serve: close the old epoch's node", "err", err)
	}
	m, node, err := r.srv.build(r, e)
	if err != nil {
		// The options built a Machine once, so this is a bug; the old
		// Machine's L1 is the last engine's: refuse sessions, never
		// serve it.
		r.broken = fmt.Errorf("rank %d: rebuild for epoch %d: %w: %w", r.idx, e.n, err, errBroken)
		r.log.Error("kvtier serve: rank broken", "err", r.broken)
		return
	}
	r.retire()
	r.m, r.node, r.epoch = m, node, e
	clear(r.byID)
	// NB: request ids are in the replicated events; every rank's new
	// Machine numbers them from 1, whatever the old epoch applied.
	r.nextReq = 0
	r.log.Debug("kvtier serve: new epoch", "epoch", e.n, "why", why)
}

var (
	errUnknownSession = errors.New("unknown session")
	errStaleBoot      = errors.New("stale boot_id")
	errBroken         = errors.New("rank out of service; restart serve")
	errEngineFailed   = errors.New("the engine reported the plan failed")
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
// and never changes state for a refused item.
func (r *rank) step(ctx context.Context, q *pb.StepRequest) *pb.StepReply {
	out := &pb.StepReply{BootId: r.srv.boot, Tick: r.m.Ticks()}
	errs := stepErrs{out, &r.stats}
	s := r.sess
	switch {
	case s == nil || q.GetSession() != s.id:
		if why := r.srv.endedWhy(q.GetSession()); why != "" {
			errs.add(ref{"session", -1}, "", pb.ErrorCode_ERROR_CODE_UNKNOWN, "session %q ended: %s; register again", q.GetSession(), why)
			return out
		}
		errs.add(ref{"session", -1}, "", pb.ErrorCode_ERROR_CODE_UNKNOWN, "session %q is not open on rank %d: register again", q.GetSession(), r.idx)
		return out
	case q.GetBootId() != r.srv.boot:
		errs.add(ref{"boot_id", -1}, "", pb.ErrorCode_ERROR_CODE_STATE, "boot_id %q is stale: serve is %q since its restart; register again", q.GetBootId(), r.srv.boot)
		return out
	case q.GetStep() <= s.lastStep:
		errs.add(ref{"step", -1}, "", pb.ErrorCode_ERROR_CODE_STATE, "step %d does not follow step %d", q.GetStep(), s.lastStep)
		return out
	}
	items := len(q.GetCompletions()) + len(q.GetLookups()) + len(q.GetStores()) + len(q.GetFinished()) + len(q.GetAborted()) + len(q.GetUpcoming())
	if limit := r.srv.cfg.MaxItemsPerStep; items > limit {
		errs.add(ref{"step", -1}, "", pb.ErrorCode_ERROR_CODE_LIMIT, "%d items, at most %d a step", items, limit)
		return out
	}
	eg := r.engineMember()
	if eg != nil && r.tickDone != nil && len(q.GetFrontier()) == 0 {
		errs.add(ref{"frontier", -1}, "", pb.ErrorCode_ERROR_CODE_STATE,
			"tick %d waits for the engine's frontier: all-reduce the contributions the ranks' last steps returned and send it; nothing of this step was applied", r.m.Ticks())
		out.Contribution, _, _ = eg.PendingEncoded()
		return out
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
			return out
		}
	}

	// 1. Completions.
	seen := map[uint64]bool{}
	for i, c := range q.GetCompletions() {
		item := ref{"completions", i}
		id := tiers.BatchID(c.GetPlan())
		switch {
		case seen[c.GetPlan()]:
			errs.add(item, "", pb.ErrorCode_ERROR_CODE_DUPLICATE, "plan %d reported twice in the step", c.GetPlan())
			continue
		case !r.pool.Outstanding(id):
			errs.add(item, "", pb.ErrorCode_ERROR_CODE_UNKNOWN, "plan %d was never made or is already reported", c.GetPlan())
			continue
		}
		seen[c.GetPlan()] = true
		var why error
		if !c.GetOk() {
			why = errEngineFailed
		}
		if err := r.pool.CompleteBatch(id, why); err != nil {
			errs.add(item, "", pb.ErrorCode_ERROR_CODE_UNKNOWN, "plan %d: %v", c.GetPlan(), err)
		}
	}
	r.failOverdue(errs, time.Now())
	r.node.Drain()

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
	if err := r.tick(ctx); err != nil {
		// The group stopped (a rank's engine did not step in time, or
		// the ranks diverged, or a peer's session ended): every session
		// ends, a new epoch starts; the engine registers again and
		// recomputes what was pending.
		r.groupStopped(ctx, errs, ref{"step", -1}, err)
		return out
	}

	r.finishStep(s, out)
	out.Contribution = []byte(control.Frontier(r.m.Contribution()).String())
	return out
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
	r.plans = r.pool.TakePlans(r.plans[:0])
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
	out.Tick = r.m.Ticks()
	if r.m.Options().DigestEvery > 0 && r.m.Ticks()%uint64(r.m.Options().DigestEvery) == 0 {
		d := r.m.Digest()
		out.Digest = d[:]
		if r.epoch == nil || r.epoch.members == nil {
			// A rank of one offers its digest to the engine only; a
			// group's exchange counts its own (timedGroup).
			r.stats.digests.Add(1)
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
		case !r.pool.Outstanding(id):
			delete(r.planSent, id)
		case now.Sub(at) > r.srv.cfg.PlanTimeout:
			late = append(late, id)
		}
	}
	slices.Sort(late)
	for _, id := range late {
		delete(r.planSent, id)
		if err := r.pool.CompleteBatch(id, errPlanOverdue); err != nil {
			continue // reported or failed meanwhile
		}
		r.stats.overduePlans.Add(1)
		r.log.Warn("kvtier serve: plan overdue; failed and rolled back", "plan", uint64(id), "timeout", r.srv.cfg.PlanTimeout)
		errs.add(ref{"plan:" + strconv.FormatUint(uint64(id), 10), -1}, "", pb.ErrorCode_ERROR_CODE_UNAVAILABLE,
			"plan %d was not reported within %v: serve failed it and rolls its copies back; do not run it, and do not report it (a late completion is UNKNOWN)", uint64(id), r.srv.cfg.PlanTimeout)
	}
}

// stepEngine ends a step when the engine is the group transport: what the
// last tick (completed by this step's frontier) and this step's inputs
// made ready goes out, then the next tick starts and waits for the
// engine's frontier; the reply carries its contribution in the wire
// encoding (consensus.AppendContribution), which the engine all-reduces
// with its ranks' (consensus.ReduceEncoded computes the same).
func (r *rank) stepEngine(ctx context.Context, eg *enginegroup.Member, s *session, out *pb.StepReply, errs stepErrs) *pb.StepReply {
	r.finishStep(s, out)
	enc, err := r.startTick(ctx, eg)
	if err != nil {
		r.groupStopped(ctx, errs, ref{"step", -1}, err)
		return out
	}
	out.Contribution = enc
	return out
}

// engineMember returns the rank's member of the engine group, or nil when
// serve exchanges in process.
func (r *rank) engineMember() *enginegroup.Member {
	if r.epoch == nil || r.epoch.engine == nil {
		return nil
	}
	return r.epoch.engine[r.idx]
}

// startTick runs the Node's next tick on a goroutine until its exchange
// has published the contribution, and returns it encoded. The goroutine
// then waits in the exchange (owning the Node) until finishTick delivers
// the engine's frontier or abortTick ends it.
func (r *rank) startTick(ctx context.Context, eg *enginegroup.Member) ([]byte, error) {
	select {
	case <-eg.Published(): // a stale signal from an aborted tick
	default:
	}
	tctx, cancel := context.WithCancel(ctx)
	done := make(chan tickResult, 1)
	node := r.node
	go func() {
		rd, err := node.Tick(tctx)
		done <- tickResult{rd, err}
	}()
	select {
	case <-eg.Published():
		enc, ok, err := eg.PendingEncoded()
		if err == nil && !ok {
			err = fmt.Errorf("rank %d: the exchange published nothing", r.idx)
		}
		r.tickDone, r.tickCancel = done, cancel
		if err != nil {
			r.abortTick()
			return nil, err
		}
		return enc, nil
	case res := <-done:
		cancel()
		if res.err == nil {
			res.err = fmt.Errorf("rank %d: the tick ended without an exchange", r.idx)
		}
		return nil, res.err
	}
}

// finishTick delivers the engine's frontier to the waiting tick and waits
// for it to finish. A frontier that does not fit the rank's contribution
// (another tick, group or shape, a counter above the rank's, digests that
// differ) stops the group.
func (r *rank) finishTick(ctx context.Context, eg *enginegroup.Member, frontier []byte) error {
	done, cancel := r.tickDone, r.tickCancel
	r.tickDone, r.tickCancel = nil, nil
	derr := eg.DeliverEncoded(frontier)
	res := <-done
	cancel()
	if res.err != nil {
		r.log.Error("kvtier serve: tick", "epoch", r.epoch.n, "err", res.err)
		return res.err
	}
	if derr != nil {
		return derr
	}
	r.unholds(ctx, res.rd.Unholds)
	return nil
}

// abortTick ends a tick waiting for the engine's frontier (its Machine is
// about to be replaced).
func (r *rank) abortTick() {
	if r.tickDone == nil {
		return
	}
	r.tickCancel()
	<-r.tickDone
	r.tickDone, r.tickCancel = nil, nil
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
func (r *rank) ready(rq *request) bool { return !rq.held && !r.m.Loading(rq.id) }

// result is a DONE lookup result: the hit prefix readable in L1 now.
func (r *rank) result(rq *request) *pb.LookupResult {
	rq.done = true
	r.refs = r.m.MatchedL1(rq.id, r.refs[:0])
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
// together) into one CopyPlan per batch.
func planMsgs(dst []*pb.CopyPlan, pcs []l1cuda.PlannedCopy) []*pb.CopyPlan {
	for i, pc := range pcs {
		if i == 0 || pcs[i-1].Batch != pc.Batch {
			m := &pb.CopyPlan{Plan: uint64(pc.Batch), Direction: pb.Direction_DIRECTION_FROM_SLAB}
			if pc.ToSlab {
				m.Direction = pb.Direction_DIRECTION_TO_SLAB
			}
			dst = append(dst, m)
		}
		m := dst[len(dst)-1]
		it := pc.Copy
		m.Items = append(m.Items, &pb.CopyItem{L1Page: uint32(it.Page), Kind: uint32(it.Kind), Slab: uint32(it.Span.Slab), Offset: uint64(it.Span.Offset), Length: uint64(it.Span.Length)})
	}
	return dst
}

func errorCodeName(code int) string {
	n := pb.ErrorCode(code).String()
	return strings.ToLower(strings.TrimPrefix(n, "ERROR_CODE_"))
}

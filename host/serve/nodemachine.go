package serve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/host"
	"github.com/kvtier/kvtier/host/assemble"
	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/tiers"
)

// One control Machine for the node (issue 26 part 1).
//
// The ranks one serve hosts are one engine's ranks: they step in
// lockstep, send the same lookups, stores and ends, and their Machines
// decide the same by design. With more than one rank and the in-process
// or TCP group (Config.MachinePerRank off), serve runs that Machine once,
// in a host.Multi that carries each decision out on every rank's own
// tiers (its L1 plans, its slab, its store: its own pages with owner
// lanes, every page without) and reduces what each rank finished before
// it ticks. There is no exchange between the ranks (with --group tcp,
// only between the nodes): their steps meet at a barrier instead, and
// the last rank to arrive runs the step for all of them:
//
//  1. every rank's completions go to its own Node (they are in the tick
//     of this step, as the frontier had them when each rank had a
//     Machine);
//  2. every other rank's step must carry rank 0's items (the same
//     lookups, stores, ends and hint, under the same namespace); a rank
//     whose step differs stops the group before any lookup, store or
//     end of the step applies, as a digest mismatch did: every session ends, and the
//     engine registers again;
//  3. rank 0's step runs against the Machine;
//  4. every other rank's reply is rank 0's answers (its item errors,
//     lookup results, placements, tick and digest, shared) with the
//     rank's own copy plans and rank 0's contribution under the rank's
//     envelope. Only rank 0 keeps the session's requests; the others'
//     counters take rank 0's step's.
//
// Each rank's goroutine still owns its session and requests; while the
// step runs, every other rank's goroutine waits at the barrier. Every
// other use of the node's Machine (a session's end, a new epoch, the
// metrics' snapshot) holds Server.nodeMu.

// nodeMachine is the one Machine of the node's ranks for one epoch.
type nodeMachine struct {
	epoch *epoch
	multi *host.Multi
	// slots holds, per rank, its step waiting at the barrier (nil: none).
	slots   []*stepSlot
	arrived int
	closed  bool
}

// stepSlot is one rank's step at the barrier.
type stepSlot struct {
	r         *rank
	q         *pb.StepRequest
	out       *pb.StepReply
	errs      stepErrs
	done      chan struct{}
	processed bool
}

// errRanksDiffer stops a group whose ranks' steps differ.
var errRanksDiffer = errors.New("the engine's ranks sent different steps")

// oneMachine reports whether the ranks share one Machine: more than one
// rank in the in-process or TCP group, unless Config.MachinePerRank (the
// engine transport keeps a Machine a rank: docs/serve.md).
func (s *Server) oneMachine() bool {
	return (s.cfg.Group == GroupInproc || s.cfg.Group == GroupTCP) && s.cfg.Ranks > 1 && !s.cfg.MachinePerRank
}

// lockNode and unlockNode guard the node's Machine (one-Machine mode
// only; else every rank's goroutine owns its own).
func (s *Server) lockNode() {
	if s.oneMachine() {
		s.nodeMu.Lock()
	}
}

func (s *Server) unlockNode() {
	if s.oneMachine() {
		s.nodeMu.Unlock()
	}
}

// buildNode makes the node's Machine for epoch e over every rank's stack
// and gives each rank its view. Called with nodeMu held (or before
// serving).
func (s *Server) buildNode(e *epoch) (*nodeMachine, error) {
	r0 := s.ranks[0]
	locals := make([]host.Local, len(s.ranks))
	for i, r := range s.ranks {
		locals[i] = host.Local{Stack: r.st, Rank: r.nodeOpts.Rank}
	}
	opts := r0.nodeOpts
	opts.Logger = s.log
	// The group: none in process (host.Solo); with --group tcp the other
	// nodes' serve processes, digests compared every DigestEvery ticks.
	// NB: the digests a reply offers are counted per rank (finishStep).
	mu, _, err := assemble.Multi(locals, r0.mo, opts, func(m *control.Machine) host.Group {
		if e.members == nil {
			return host.Solo{}
		}
		g := epochGroup{g: host.ConsensusGroup{G: e.members[0], M: m, DigestEvery: r0.mo.DigestEvery}, ctx: e.ctx}
		return timedGroup{g: g, m: s.metrics, rank: 0, st: &r0.stats, waiting: &r0.exchanging}
	})
	if err != nil {
		return nil, err
	}
	return &nodeMachine{epoch: e, multi: mu, slots: make([]*stepSlot, len(s.ranks))}, nil
}

// nodeFor returns the node's Machine for epoch e, building it when the
// current one is of an earlier epoch: the old one settles (bounded) and
// closes first, so no store operation of it still writes a slab span the
// new Machine reuses. Called with nodeMu held.
func (s *Server) nodeFor(ctx context.Context, e *epoch) (*nodeMachine, error) {
	if s.nm != nil && s.nm.epoch.n >= e.n {
		return s.nm, nil
	}
	if old := s.nm; old != nil && !old.closed {
		// Every rank's session ends with the epoch: the plans their
		// engines still owe are failed now, not when each rank catches
		// up, so the settle does not wait for them.
		for i := range old.multi.Ranks() {
			n := old.multi.Rank(i).FailPlans(fmt.Errorf("the session ended before reporting the plan"))
			s.ranks[i].stats.rolledBack.Add(int64(n))
		}
		if err := old.multi.Settle(ctx); err != nil {
			s.log.Error("kvtier serve: settle before a new epoch", "err", err)
		}
		if n := old.multi.Outstanding(); n > 0 {
			s.log.Warn("kvtier serve: store operations abandoned at a new epoch", "batches", n)
		}
		if err := old.close(); err != nil {
			s.log.Error("kvtier serve: close the old epoch's node", "err", err)
		}
	}
	nm, err := s.buildNode(e)
	if err != nil {
		return nil, err
	}
	s.nm = nm
	return nm, nil
}

func (nm *nodeMachine) close() error {
	if nm.closed {
		return nil
	}
	nm.closed = true
	return nm.multi.Close()
}

// view returns rank i's view of the node's Machine.
func (nm *nodeMachine) view(i int) *rankView {
	return &rankView{nm: nm, n: nm.multi.Rank(i), i: i}
}

// stepTogether puts r's step (accepted by stepStart) at the barrier and
// returns its reply once the last rank's arrival ran the step for all.
// Called with nodeMu held; it is released while the rank waits.
func (s *Server) stepTogether(ctx context.Context, r *rank, q *pb.StepRequest, out *pb.StepReply, errs stepErrs) *pb.StepReply {
	v := r.node.(*rankView)
	nm := v.nm
	slot := &stepSlot{r: r, q: q, out: out, errs: errs, done: make(chan struct{})}
	nm.slots[r.idx] = slot
	nm.arrived++
	if nm.arrived == len(nm.slots) {
		s.metrics.observeBarrier(r.idx, 0)
		s.runStep(ctx, nm)
		return slot.out
	}
	t0 := time.Now()
	defer func() { s.metrics.observeBarrier(r.idx, time.Since(t0)) }()
	r.exchanging.Add(1)
	// NB: the epoch is read under the lock: the rank that runs the step
	// may move this rank to a new epoch meanwhile (its session ended).
	ectx := r.epoch.ctx
	s.nodeMu.Unlock()
	t := time.NewTimer(s.cfg.GroupTimeout)
	var why error
	select {
	case <-slot.done:
	case <-t.C:
	case <-ectx.Done():
	case <-ctx.Done():
	}
	t.Stop()
	s.nodeMu.Lock()
	r.exchanging.Add(-1)
	if slot.processed {
		return slot.out
	}
	nm.slots[r.idx] = nil
	nm.arrived--
	switch {
	case ectx.Err() != nil:
		why = context.Cause(ectx)
	case ctx.Err() != nil:
		why = ctx.Err()
	default:
		var missing []int
		for i, sl := range nm.slots {
			if sl == nil && i != r.idx {
				missing = append(missing, s.groupRank(i))
			}
		}
		why = fmt.Errorf("rank %d at tick %d: ranks %v did not step within %v: %w", s.groupRank(r.idx), v.Ticks(), missing, s.cfg.GroupTimeout, consensus.ErrTimeout)
	}
	r.groupStopped(ctx, errs, ref{"step", -1}, why)
	return out
}

// runStep runs the step of every rank at the barrier (see the file
// comment) and releases them.
func (s *Server) runStep(ctx context.Context, nm *nodeMachine) {
	slots := nm.slots
	for _, sl := range slots {
		sl.r.stepCompletions(ctx, sl.q, sl.errs)
	}
	r0 := slots[0]
	var differ error
	for _, sl := range slots[1:] {
		if differ = s.sameStep(r0, sl); differ != nil {
			break
		}
	}
	switch {
	case differ != nil:
		for _, sl := range slots {
			sl.r.stats.mismatches.Add(1)
			sl.r.groupStopped(ctx, sl.errs, ref{"step", -1}, differ)
		}
	default:
		start, before, ep := len(r0.out.Errors), r0.r.stats.stepCounts(), r0.r.epoch
		r0.out = r0.r.stepRest(ctx, r0.q, r0.out, r0.errs, nil)
		delta := r0.r.stats.stepCounts().minus(before)
		for _, sl := range slots[1:] {
			if r0.r.epoch != ep {
				// Rank 0's tick failed: the group stopped for all.
				sl.r.groupStopped(ctx, sl.errs, ref{"step", -1}, r0.r.stopErr)
				continue
			}
			sl.r.mirror(sl.out, r0.out, start, delta)
		}
	}
	for i, sl := range slots {
		nm.slots[i] = nil
		sl.processed = true
		close(sl.done)
	}
	nm.arrived = 0
}

// sameStep reports how rank sl's step differs from rank 0's (r0) in what
// the Machine would apply, or nil.
func (s *Server) sameStep(r0, sl *stepSlot) error {
	differ := func(format string, args ...any) error {
		return fmt.Errorf("rank %d's step %d differs from rank %d's: %s: %w", s.groupRank(sl.r.idx), sl.q.GetStep(), s.groupRank(r0.r.idx), fmt.Sprintf(format, args...), errRanksDiffer)
	}
	a, b := r0.q, sl.q
	if r0.r.sess.keyer != sl.r.sess.keyer {
		return differ("its session's namespace (model, layout, dtype, salt or page geometry)")
	}
	if i, n, ok := sameKeys(a.GetLookups(), b.GetLookups()); !ok {
		return differ("lookups[%d] (it sent %d, rank 0 %d)", i, n, len(a.GetLookups()))
	}
	if i, n, ok := sameKeys(a.GetStores(), b.GetStores()); !ok {
		return differ("stores[%d] (it sent %d, rank 0 %d)", i, n, len(a.GetStores()))
	}
	if len(a.GetFinished()) != len(b.GetFinished()) {
		return differ("%d finished, rank 0 %d", len(b.GetFinished()), len(a.GetFinished()))
	}
	for i, x := range a.GetFinished() {
		if y := b.GetFinished()[i]; x.GetReqId() != y.GetReqId() {
			return differ("finished[%d] (%q)", i, y.GetReqId())
		}
	}
	if len(a.GetAborted()) != len(b.GetAborted()) {
		return differ("%d aborted, rank 0 %d", len(b.GetAborted()), len(a.GetAborted()))
	}
	for i, x := range a.GetAborted() {
		if y := b.GetAborted()[i]; x.GetReqId() != y.GetReqId() {
			return differ("aborted[%d] (%q)", i, y.GetReqId())
		}
	}
	if len(a.GetUpcoming()) != len(b.GetUpcoming()) {
		return differ("%d upcoming, rank 0 %d", len(b.GetUpcoming()), len(a.GetUpcoming()))
	}
	for i, x := range a.GetUpcoming() {
		if y := b.GetUpcoming()[i]; x.GetPages() != y.GetPages() || !bytes.Equal(x.GetHashes(), y.GetHashes()) {
			return differ("upcoming[%d]", i)
		}
	}
	return nil
}

// keyed is a step item that names a request's pages (Lookup, Store).
type keyed interface {
	GetReqId() string
	GetPages() uint32
	GetHashes() []byte
}

// sameKeys reports whether b's items name the same requests and pages
// as a's, in order; when not, the first index that differs (len(a) when
// b is longer) and b's length.
func sameKeys[T keyed](a, b []T) (i, n int, ok bool) {
	for i = range min(len(a), len(b)) {
		x, y := a[i], b[i]
		if x.GetReqId() != y.GetReqId() || x.GetPages() != y.GetPages() || !bytes.Equal(x.GetHashes(), y.GetHashes()) {
			return i, len(b), false
		}
	}
	return min(len(a), len(b)), len(b), len(a) == len(b)
}

// mirror completes rank r's reply out from rank 0's reply r0 to the same
// step: the step's item errors (from index start of r0's; r0's earlier
// ones are its own completions'), lookup results, placements, tick and
// digest, shared; its own plans; rank 0's contribution under r's
// envelope; and rank 0's step's counts added to r's. Nothing of the
// Machine is computed again (a digest tick's digests are one Machine's).
func (r *rank) mirror(out, r0 *pb.StepReply, start int, delta stepCounts) {
	for _, e := range r0.Errors[start:] {
		out.Errors = append(out.Errors, e)
		if c := int(e.GetCode()); c < len(r.stats.itemErrors) {
			r.stats.itemErrors[c].Add(1)
		}
	}
	out.Lookups, out.Placements, out.Tick, out.Digest = r0.Lookups, r0.Placements, r0.Tick, r0.Digest
	if len(out.Digest) > 0 {
		r.stats.digests.Add(1)
	}
	r.stats.add(delta)
	r.ownPlans(out)
	if len(r0.Contribution) == 0 {
		return
	}
	env := consensus.Envelope{Rank: r.srv.groupRank(r.idx), Size: r.srv.world()}
	_, c, err := consensus.DecodeContribution(r0.Contribution, consensus.Expect{Size: env.Size})
	if err == nil {
		out.Contribution, err = consensus.AppendContribution(nil, env, c)
	}
	if err != nil {
		r.log.Error("kvtier serve: re-address rank 0's contribution", "tick", out.Tick, "err", err)
	}
}

// rankView is one rank's view of the node's Machine: what the rank's
// code asks of its Node (rankNode). Its events and ticks (rank 0's
// alone, in a step) go to the Machine; its plans, stats and in-flight
// counts are the rank's own Node's.
type rankView struct {
	nm *nodeMachine
	n  *host.Node // the rank's own Node in the Multi (rank i)
	i  int
}

var _ rankNode = (*rankView)(nil)

func (v *rankView) Apply(ctx context.Context, e control.Event) (control.Ready, error) {
	return v.nm.multi.Apply(ctx, e)
}

func (v *rankView) Tick(ctx context.Context) (control.Ready, error) { return v.nm.multi.Tick(ctx) }

func (v *rankView) Loading(req control.ReqID) bool { return v.n.Loading(req) }

func (v *rankView) MatchedL1(req control.ReqID, dst []control.PageRef) []control.PageRef {
	return v.n.MatchedL1(req, dst)
}

// Drain feeds every rank's acks to the Machine (the Multi's reduction).
func (v *rankView) Drain() { v.nm.multi.Drain() }

// Settle settles the node's Machine (every rank's work).
func (v *rankView) Settle(ctx context.Context) error {
	if v.nm.closed {
		return nil
	}
	return v.nm.multi.Settle(ctx)
}

// Close closes the node's Machine once.
func (v *rankView) Close() error { return v.nm.close() }

// PoolReady and StoreReady never fire: the ranks' acks are drained at
// each step (and by Settle), on the goroutine that runs it.
func (v *rankView) PoolReady() <-chan struct{}  { return nil }
func (v *rankView) StoreReady() <-chan struct{} { return nil }

func (v *rankView) TakePlans(dst []host.PlannedCopy) []host.PlannedCopy { return v.n.TakePlans(dst) }
func (v *rankView) PlanOutstanding(id tiers.BatchID) bool               { return v.n.PlanOutstanding(id) }
func (v *rankView) CompletePlan(id tiers.BatchID, why error, sums []uint32) error {
	return v.n.CompletePlan(id, why, sums)
}
func (v *rankView) FailPlans(why error) int { return v.n.FailPlans(why) }

func (v *rankView) Ticks() uint64 { return v.n.Ticks() }
func (v *rankView) AppendContribution(dst []byte, env consensus.Envelope) ([]byte, error) {
	return v.n.AppendContribution(dst, env)
}
func (v *rankView) DueDigest() ([32]byte, bool) { return v.n.DueDigest() }
func (v *rankView) Free() (l1, l2 int64)        { return v.n.Free() }
func (v *rankView) SpillQueueLen() int          { return v.n.SpillQueueLen() }
func (v *rankView) InFlight() (pool, store int) { return v.n.InFlight() }
func (v *rankView) Outstanding() int            { return v.n.Outstanding() }

// Stats are the rank's own Node's counters, with the Machine's skips and
// ticks (each rank's own Machine would have counted the same).
func (v *rankView) Stats() host.Stats { return v.nm.multi.RankStats(v.i) }

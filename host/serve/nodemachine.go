package serve

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
// group (Config.MachinePerRank off), serve runs that Machine once, in a
// host.Multi that carries each decision out on every rank's own tiers
// (its L1 plans, its slab, its store: its own pages with owner lanes,
// every page without) and reduces what each rank finished before it
// ticks. There is no exchange between the ranks: their steps meet at a
// barrier instead, and the last rank to arrive runs the step for all of
// them, in rank order:
//
//  1. every rank's completions go to its own Node (they are in the tick
//     of this step, as the frontier had them when each rank had a
//     Machine);
//  2. rank 0's step runs against the Machine, and each of its Machine
//     calls (events and the tick) and their answers are logged;
//  3. every other rank's step runs the same code over the log: each
//     Machine call it makes must be the logged one (the same event, the
//     tick, or a read of a request's state: whether it loads, its pages
//     in L1), and gets the logged answer, so a reply reads the Machine
//     as rank 0's did at the same point of the step;
//  4. a rank whose calls differ from rank 0's (its engine sent another
//     step) stops the group, as a digest mismatch did: every session
//     ends, and the engine registers again.
//
// Each rank's goroutine still owns its session and requests; while the
// step runs, every other rank's goroutine waits at the barrier. Every
// other use of the node's Machine (a session's end, a new epoch, the
// metrics' snapshot) holds Server.nodeMu.

// nodeMachine is the one Machine of the node's ranks for one epoch.
type nodeMachine struct {
	epoch *epoch
	multi *host.Multi
	// log is rank 0's Machine calls of the step in progress.
	log []machineCall
	// slots holds, per rank, its step waiting at the barrier (nil: none).
	slots   []*stepSlot
	arrived int
	closed  bool
}

// machineCall is one logged Machine call and its answer.
type machineCall struct {
	kind callOf
	e    control.Event
	rd   control.Ready
	err  error
	// req, loading and refs: a read of a request's state.
	req     control.ReqID
	loading bool
	refs    []control.PageRef
}

type callOf uint8

const (
	callOfEvent callOf = iota
	callOfTick
	callOfLoading
	callOfMatched
)

func (c callOf) String() string {
	return [...]string{"an event", "the tick", "a read of whether a request loads", "a read of a request's L1 pages"}[c]
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
// rank in the in-process group, unless Config.MachinePerRank.
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
		var g host.Group = host.Solo{}
		if e.members != nil {
			g = epochGroup{g: host.ConsensusGroup{G: e.members[0], M: m, DigestEvery: r0.mo.DigestEvery}, ctx: e.ctx}
		}
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
		s.runStep(ctx, nm)
		return slot.out
	}
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
	nm.log = nm.log[:0]
	var differ error
	for k, sl := range slots {
		v := sl.r.node.(*rankView)
		v.inStep, v.replay, v.cursor, v.differ = true, k > 0, 0, nil
		sl.out = sl.r.stepRest(ctx, sl.q, sl.out, sl.errs, nil)
		v.inStep = false
		if v.replay && v.differ == nil && v.cursor != len(nm.log) {
			v.differ = fmt.Errorf("rank %d made %d of rank %d's %d calls to the Machine: %w", s.groupRank(sl.r.idx), v.cursor, s.groupRank(0), len(nm.log), errRanksDiffer)
		}
		v.replay = false
		if differ == nil {
			differ = v.differ
		}
	}
	if differ != nil {
		for _, sl := range slots {
			o := sl.out
			o.Lookups, o.Placements, o.Plans, o.Digest, o.Contribution = nil, nil, nil, nil, nil
			sl.r.stats.mismatches.Add(1)
			sl.r.groupStopped(ctx, sl.errs, ref{"step", -1}, differ)
		}
	}
	for i, sl := range slots {
		nm.slots[i] = nil
		sl.processed = true
		close(sl.done)
	}
	nm.arrived = 0
}

// rankView is one rank's view of the node's Machine: what the rank's
// code asks of its Node (rankNode). Its events and ticks go to the
// Machine when it is rank 0's (logged) and are checked against the log
// and answered from it for the others; its plans, stats and in-flight
// counts are the rank's own Node's.
type rankView struct {
	nm *nodeMachine
	n  *host.Node
	i  int
	// inStep: the rank's step runs (runStep): its Machine calls are
	// logged (rank 0) or replayed (replay, the others).
	inStep bool
	replay bool
	cursor int
	// differ is the first call that differed from the log.
	differ error
}

var _ rankNode = (*rankView)(nil)

func (v *rankView) Apply(ctx context.Context, e control.Event) (control.Ready, error) {
	if !v.replay {
		rd, err := v.nm.multi.Apply(ctx, e)
		if v.inStep {
			v.nm.log = append(v.nm.log, machineCall{kind: callOfEvent, e: e, rd: answer(rd), err: err})
		}
		return rd, err
	}
	c, err := v.next(machineCall{kind: callOfEvent, e: e})
	if err != nil {
		return control.Ready{}, err
	}
	return c.rd, c.err
}

func (v *rankView) Tick(ctx context.Context) (control.Ready, error) {
	if !v.replay {
		rd, err := v.nm.multi.Tick(ctx)
		if v.inStep {
			v.nm.log = append(v.nm.log, machineCall{kind: callOfTick, rd: answer(rd), err: err})
		}
		return rd, err
	}
	c, err := v.next(machineCall{kind: callOfTick})
	if err != nil {
		return control.Ready{}, err
	}
	return c.rd, c.err
}

// Loading and MatchedL1 read a request's state; in a step they are
// logged and replayed like the events (see the file comment).
func (v *rankView) Loading(req control.ReqID) bool {
	if !v.replay {
		b := v.n.Loading(req)
		if v.inStep {
			v.nm.log = append(v.nm.log, machineCall{kind: callOfLoading, req: req, loading: b})
		}
		return b
	}
	c, err := v.next(machineCall{kind: callOfLoading, req: req})
	return err == nil && c.loading
}

func (v *rankView) MatchedL1(req control.ReqID, dst []control.PageRef) []control.PageRef {
	if !v.replay {
		n := len(dst)
		dst = v.n.MatchedL1(req, dst)
		if v.inStep {
			v.nm.log = append(v.nm.log, machineCall{kind: callOfMatched, req: req, refs: slices.Clone(dst[n:])})
		}
		return dst
	}
	c, err := v.next(machineCall{kind: callOfMatched, req: req})
	if err != nil {
		return dst
	}
	return append(dst, c.refs...)
}

// answer keeps what a rank's code reads of a Ready (matches, placements,
// unholds: fresh at every Advance, so they outlive the step); the work
// lists, reused by later Advances, are the Multi's business.
func answer(rd control.Ready) control.Ready {
	return control.Ready{Tick: rd.Tick, Matches: rd.Matches, Placements: rd.Placements, Holds: rd.Holds, Unholds: rd.Unholds, Skips: rd.Skips}
}

// next answers a replaying rank's call from the log, or records that it
// differs.
func (v *rankView) next(want machineCall) (machineCall, error) {
	if v.differ != nil {
		return machineCall{}, v.differ
	}
	if v.cursor >= len(v.nm.log) {
		v.differ = fmt.Errorf("rank %d's call %d to the Machine (%s) is one rank 0 did not make: %w", v.i, v.cursor+1, want, errRanksDiffer)
		return machineCall{}, v.differ
	}
	c := &v.nm.log[v.cursor]
	v.cursor++
	if c.kind != want.kind || c.req != want.req || (c.kind == callOfEvent && !sameEvent(c.e, want.e)) {
		v.differ = fmt.Errorf("rank %d's call %d to the Machine (%s) differs from rank 0's (%s): %w", v.i, v.cursor, want, c, errRanksDiffer)
		return machineCall{}, v.differ
	}
	return *c, nil
}

// String names the call, for the error that says a rank's differed.
func (c machineCall) String() string {
	switch c.kind {
	case callOfEvent:
		return fmt.Sprintf("a %s event of request %d, %d pages", c.e.Kind, c.e.Req, c.e.Pages)
	case callOfLoading, callOfMatched:
		return fmt.Sprintf("%s (%d)", c.kind, c.req)
	}
	return c.kind.String()
}

func sameEvent(a, b control.Event) bool {
	return a.Kind == b.Kind && a.Req == b.Req && a.Node == b.Node && a.Pages == b.Pages && a.Op == b.Op &&
		a.Stage == b.Stage && a.OK == b.OK && a.Tier == b.Tier && slices.Equal(a.Hashes, b.Hashes)
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
func (v *rankView) Stats() host.Stats {
	st := v.n.Stats()
	ms := v.nm.multi.Stats()
	st.Skips, st.Ticks = ms.Skips, ms.Ticks
	return st
}

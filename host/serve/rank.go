package serve

import (
	"context"
	"errors"
	"log/slog"
	"runtime/trace"
	"sync/atomic"
	"time"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/host"
	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/host/stack"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

// rank hosts one rank: its stack and Node (which owns the rank's Machine), and the session of
// the engine rank that talks to it. One goroutine (loop) owns all of it.
type rank struct {
	idx   int
	srv   *Server
	st    *stack.Stack
	node  rankNode
	plans []host.PlannedCopy // reused by step
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

	// stopErr is why the rank's group last stopped (groupStopped).
	stopErr error
}

// rankNode is what a rank asks of its host.Node, which owns the rank's
// Machine and carries out what it asks: serve holds nothing else of the
// rank's control state.
type rankNode interface {
	// Apply, Tick, Drain and Settle run the Machine (host.Node).
	Apply(ctx context.Context, e control.Event) (control.Ready, error)
	Tick(ctx context.Context) (control.Ready, error)
	Drain()
	Settle(ctx context.Context) error
	Close() error
	// PoolReady and StoreReady signal work for Drain.
	PoolReady() <-chan struct{}
	StoreReady() <-chan struct{}

	// The engine's copy plans (the stack's pool is `use: engine`).
	TakePlans(dst []host.PlannedCopy) []host.PlannedCopy
	PlanOutstanding(id tiers.BatchID) bool
	CompletePlan(id tiers.BatchID, why error, sums []uint32) error
	FailPlans(why error) int

	// What a reply and the metrics read.
	Ticks() uint64
	AppendContribution(dst []byte, env consensus.Envelope) ([]byte, error)
	DueDigest() ([32]byte, bool)
	Loading(req control.ReqID) bool
	MatchedL1(req control.ReqID, dst []control.PageRef) []control.PageRef
	Free() (l1, l2 int64)
	SpillQueueLen() int
	InFlight() (pool, store int)
	Outstanding() int
	Stats() host.Stats
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

// stepCounts are the counters a step's lookups and stores move: with one
// Machine for the node's ranks, rank 0's step moves them and the other
// ranks take its difference (mirror).
type stepCounts struct {
	lookups, hitPages, missPages       int64
	hitByTier                          [4]int64
	stores, placedPages, refusedStores int64
}

func (s *rankStats) stepCounts() stepCounts {
	c := stepCounts{lookups: s.lookups.Load(), hitPages: s.hitPages.Load(), missPages: s.missPages.Load(),
		stores: s.stores.Load(), placedPages: s.placedPages.Load(), refusedStores: s.refusedStores.Load()}
	for i := range c.hitByTier {
		c.hitByTier[i] = s.hitByTier[i].Load()
	}
	return c
}

func (c stepCounts) minus(b stepCounts) stepCounts {
	d := stepCounts{lookups: c.lookups - b.lookups, hitPages: c.hitPages - b.hitPages, missPages: c.missPages - b.missPages,
		stores: c.stores - b.stores, placedPages: c.placedPages - b.placedPages, refusedStores: c.refusedStores - b.refusedStores}
	for i := range d.hitByTier {
		d.hitByTier[i] = c.hitByTier[i] - b.hitByTier[i]
	}
	return d
}

func (s *rankStats) add(d stepCounts) {
	s.lookups.Add(d.lookups)
	s.hitPages.Add(d.hitPages)
	s.missPages.Add(d.missPages)
	s.stores.Add(d.stores)
	s.placedPages.Add(d.placedPages)
	s.refusedStores.Add(d.refusedStores)
	for i := range d.hitByTier {
		s.hitByTier[i].Add(d.hitByTier[i])
	}
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

// loop serves calls until ctx ends, draining tier acks and store results
// as they arrive and expiring a silent session.
func (r *rank) loop(ctx context.Context) {
	var storeReady <-chan struct{}
	if len(r.st.Stores) > 0 && !r.srv.oneMachine() {
		storeReady = r.st.Stores[0].Store.AckReady()
	}
	expire := time.NewTicker(expireEvery(r.srv.cfg.SessionTTL))
	defer expire.Stop()
	r.srv.lockNode()
	r.publish()
	r.srv.unlockNode()
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-r.calls:
			var out callReply
			r.srv.lockNode()
			// Nothing of a call applies to the Machine of an epoch that
			// ended: the rank moves to the current one first.
			r.catchUp(ctx)
			switch c.kind {
			case callRegister:
				out.reg, out.err = r.register(ctx, c.reg)
			case callStep:
				t0 := time.Now()
				reg := trace.StartRegion(ctx, "serve.step")
				out.step = r.step(ctx, c.step)
				reg.End()
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
			r.srv.unlockNode()
			c.reply <- out // buffered: never blocks
		case <-storeReady:
			// NB: while a tick waits for the engine's frontier its
			// goroutine owns the Node; it drains when it resumes.
			if r.tickDone == nil {
				r.node.Drain()
			}
		case <-r.node.PoolReady():
			if r.tickDone == nil {
				trace.WithRegion(ctx, "serve.drain.pool", r.node.Drain)
			}
		case <-r.node.StoreReady():
			// The Node's store worker answered a lookup or a get: its
			// result is a local fact, replicated at the next tick.
			if r.tickDone == nil {
				trace.WithRegion(ctx, "serve.drain.store", r.node.Drain)
			}
		case now := <-expire.C:
			r.srv.lockNode()
			if s := r.sess; s != nil && now.Sub(s.seen) > r.srv.cfg.SessionTTL {
				r.log.Warn("kvtier serve: session expired", "session", s.id, "engine", s.engineID, "silent", now.Sub(s.seen).Round(time.Millisecond))
				r.stats.expired.Add(1)
				r.endSession(ctx, "expired")
				r.publish()
			}
			r.srv.unlockNode()
		}
	}
}

// expireEvery is how often the rank looks for a silent session: a
// quarter of the TTL, at most a second.
func expireEvery(ttl time.Duration) time.Duration {
	return min(time.Second, max(ttl/4, 10*time.Millisecond))
}

var (
	errUnknownSession = errors.New("unknown session")
	errStaleBoot      = errors.New("stale boot_id")
	errBroken         = errors.New("rank out of service; restart serve")
	errEngineFailed   = errors.New("the engine reported the plan failed")
)

package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	pb "github.com/kvtier/kvtier/api/enginev1"
)

func newSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
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
	n := r.node.FailPlans(fmt.Errorf("the session ended before reporting the plan"))
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
	node, err := r.nextNode(ctx, e)
	if err != nil {
		// The options built a Machine once, so this is a bug; the old
		// Machine's L1 is the last engine's: refuse sessions, never
		// serve it.
		r.broken = fmt.Errorf("rank %d: rebuild for epoch %d: %w: %w", r.idx, e.n, err, errBroken)
		r.log.Error("kvtier serve: rank broken", "err", r.broken)
		return
	}
	r.retire()
	r.node, r.epoch = node, e
	clear(r.byID)
	// NB: request ids are in the replicated events; every rank's new
	// Machine numbers them from 1, whatever the old epoch applied.
	r.nextReq = 0
	r.log.Debug("kvtier serve: new epoch", "epoch", e.n, "why", why)
}

// nextNode returns the rank's Node for epoch e: with one Machine for the
// node's ranks, its view of that Machine (the first rank to reach e
// builds it, nodeFor); else a new Node of its own over the same stack,
// once the old one settled and closed.
func (r *rank) nextNode(ctx context.Context, e *epoch) (rankNode, error) {
	if r.srv.oneMachine() {
		nm, err := r.srv.nodeFor(ctx, e)
		if err != nil {
			return nil, err
		}
		return nm.view(r.idx), nil
	}
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
	node, err := r.srv.build(r, e)
	if err != nil {
		return nil, err
	}
	return node, nil
}

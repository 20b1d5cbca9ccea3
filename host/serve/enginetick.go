package serve

import (
	"context"
	"fmt"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/host/consensus/enginegroup"
)

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

package host

import (
	"context"

	"github.com/kvtier/kvtier/host/control"
)

// Input is one request to a running Node (Run): apply an engine event,
// then optionally settle (wait for the tiers' acks) and tick.
type Input struct {
	// Event, when set, is applied first.
	Event *control.Event
	// Settle waits for every batch in flight (bounded by SettleTimeout)
	// before the tick.
	Settle bool
	// Tick ticks the Machine through the group.
	Tick bool
	// Reply, when set, receives the outcome; it must have room for one
	// value (Run never blocks on a slow driver forever: it gives up when
	// ctx ends).
	Reply chan<- Output
}

// Output is the outcome of one Input: the Ready of the event and, when it
// ticked, the Ready of the tick.
type Output struct {
	// Event is the event's Ready (zero without an event).
	Event control.Ready
	// Tick is the tick's Ready (zero without a tick).
	Tick control.Ready
	// Err is the first error.
	Err error
}

// Run makes the calling goroutine the Node's owner: it serves inputs in
// order and drains the tiers' acks and the store operations' results
// into the Machine as they arrive, until in is closed (nil) or ctx ends (ctx.Err()). No other goroutine may call
// the Node while Run runs.
func (n *Node) Run(ctx context.Context, in <-chan Input) error {
	var storeReady <-chan struct{}
	if n.store != nil {
		storeReady = n.store.AckReady()
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case x, ok := <-in:
			if !ok {
				return nil
			}
			out := n.serve(ctx, x)
			if x.Reply != nil {
				select {
				case x.Reply <- out:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		case <-n.s.Pool.AckReady():
			n.Drain()
		case <-storeReady:
			n.Drain()
		case <-n.jobReady:
			n.Drain()
		}
	}
}

func (n *Node) serve(ctx context.Context, x Input) Output {
	var out Output
	if x.Event != nil {
		if out.Event, out.Err = n.Apply(ctx, *x.Event); out.Err != nil {
			return out
		}
	}
	if x.Settle {
		if out.Err = n.Settle(ctx); out.Err != nil {
			return out
		}
	}
	if x.Tick {
		out.Tick, out.Err = n.Tick(ctx)
	}
	return out
}

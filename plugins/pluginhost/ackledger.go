package pluginhost

import (
	"fmt"
	"time"

	"github.com/kvtier/kvtier/internal/invariants"
	"github.com/kvtier/kvtier/plugins/internal/wire"
	"github.com/kvtier/kvtier/plugins/proto/storev1"
	"github.com/kvtier/kvtier/tiers"
)

// Item states of a host batch.
const (
	itemPending  uint8 = iota
	itemGathered       // AckGathered seen
	itemDone           // terminal ack seen or synthesized
)

// hostBatch tracks the items of one Put batch so that every item gets
// exactly one terminal ack whatever happens to the plugin.
type hostBatch struct {
	gen   int
	state []uint8
	left  int
	sent  time.Time // when Put was called, for the ack deadline
}

// ackLedger is the host's bookkeeping of the Put batches a plugin holds:
// per item, which acks it has had, so that every item ends with exactly
// one terminal ack whatever the plugin sends or however it dies. It is a
// pure value (no lock, no clock, no I/O): the Store calls it under its
// mutex, with the time passed in, and queues the acks it returns.
type ackLedger struct {
	batches map[tiers.BatchID]*hostBatch
}

// open records batch id of n items, sent to generation gen at sent.
func (l *ackLedger) open(id tiers.BatchID, gen, n int, sent time.Time) {
	if l.batches == nil {
		l.batches = make(map[tiers.BatchID]*hostBatch)
	}
	l.batches[id] = &hostBatch{gen: gen, state: make([]uint8, n), left: n, sent: sent}
}

// drop forgets batch id (the plugin refused it whole) and reports whether
// it was still pending.
func (l *ackLedger) drop(id tiers.BatchID) bool {
	_, pending := l.batches[id]
	delete(l.batches, id)
	return pending
}

// apply checks generation gen's acks against the batches it was given and
// appends the host's acks to dst; name is the plugin's, for item errors. A
// violation of the ack protocol is an error wrapping wire.ErrMalformed; the
// acks before it stand (they are in the returned slice).
func (l *ackLedger) apply(gen int, name string, acks []*storev1.Ack, dst []tiers.Ack) ([]tiers.Ack, error) {
	for _, a := range acks {
		id := tiers.BatchID(a.GetBatch())
		b := l.batches[id]
		if b == nil || b.gen != gen {
			return dst, fmt.Errorf("ack for batch %d, which is not pending: %w", id, wire.ErrMalformed)
		}
		i := int(a.GetIndex())
		if i >= len(b.state) {
			return dst, fmt.Errorf("ack for item %d of batch %d, which has %d items: %w", i, id, len(b.state), wire.ErrMalformed)
		}
		stage, err := wire.FromAckStage(a.GetStage())
		if err != nil {
			return dst, fmt.Errorf("ack for batch %d item %d: %w", id, i, err)
		}
		if b.state[i] == itemDone || (stage == tiers.AckGathered && b.state[i] == itemGathered) {
			return dst, fmt.Errorf("second %s ack for batch %d item %d: %w", stage, id, i, wire.ErrMalformed)
		}
		out := tiers.Ack{Batch: id, Index: i, Stage: stage}
		switch stage {
		case tiers.AckGathered, tiers.AckDurable:
			if a.GetCode() != storev1.ResultCode_RESULT_CODE_OK {
				return dst, fmt.Errorf("%s ack for batch %d item %d with code %v: %w", stage, id, i, a.GetCode(), wire.ErrMalformed)
			}
		case tiers.AckFailed:
			itemErr, err := wire.FromResult(a.GetCode(), a.GetMessage())
			if err != nil || itemErr == nil {
				return dst, fmt.Errorf("failed ack for batch %d item %d with code %v: %w", id, i, a.GetCode(), wire.ErrMalformed)
			}
			out.Err = fmt.Errorf("plugin %s: put batch %d item %d: %w", name, id, i, itemErr)
		}
		if stage == tiers.AckGathered {
			b.state[i] = itemGathered
		} else {
			b.state[i] = itemDone
			if b.left--; b.left == 0 {
				delete(l.batches, id)
			}
		}
		dst = append(dst, out)
	}
	return dst, nil
}

// failPending appends an AckFailed ack, with err, for every item of
// generation gen's batches (all batches if gen < 0) that has no terminal
// ack yet, forgets those batches, and returns the number of items.
func (l *ackLedger) failPending(gen int, err error, dst []tiers.Ack) ([]tiers.Ack, int) {
	n := 0
	for id, b := range l.batches {
		if gen >= 0 && b.gen != gen {
			continue
		}
		for i, st := range b.state {
			if st == itemDone {
				continue
			}
			dst = append(dst, tiers.Ack{Batch: id, Index: i, Stage: tiers.AckFailed, Err: err})
			n++
		}
		delete(l.batches, id)
	}
	l.check()
	return dst, n
}

// overdue returns generation gen's batch that has waited longest past
// timeout at now, and how long it has waited; 0 if none.
func (l *ackLedger) overdue(gen int, now time.Time, timeout time.Duration) (late tiers.BatchID, age time.Duration) {
	for id, b := range l.batches {
		if b.gen == gen && now.Sub(b.sent) > timeout && now.Sub(b.sent) > age {
			late, age = id, now.Sub(b.sent)
		}
	}
	return late, age
}

// check verifies the bookkeeping (build tag invariants or race): every
// pending batch has as many items left as items without a terminal ack,
// and at least one. A violation is a bug in this package, not in the
// plugin: it panics with the state that proves it.
func (l *ackLedger) check() {
	if !invariants.Enabled {
		return
	}
	for id, b := range l.batches {
		open := 0
		for _, st := range b.state {
			if st != itemDone {
				open++
			}
		}
		if open != b.left || b.left <= 0 {
			panic(fmt.Sprintf("pluginhost: batch %d of generation %d: left=%d but %d items open (states %v)", id, b.gen, b.left, open, b.state))
		}
	}
}

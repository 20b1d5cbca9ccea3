package serve

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/kvtier/kvtier/tiers"
)

// enginePool is the Pool v1 of a rank whose L1 is the engine's memory:
// kvtier places pages in it (the Machine decides), the engine copies.
// CopyToSlab and CopyFromSlab queue a copy plan for the session's next
// Step reply; the engine runs it and reports it in a later Step, which
// acks every item. A plan the engine never reports is failed when its
// session ends (replaced, closed, expired), so the op rolls back at the
// next frontier.
//
// All methods but Stats are called by the rank's goroutine only.
type enginePool struct {
	geo    tiers.PoolGeometry
	next   tiers.BatchID
	out    []plan                 // issued since the last take
	live   map[tiers.BatchID]plan // issued, until reported
	acks   []tiers.Ack
	ready  chan struct{}
	closed bool

	toSlab, fromSlab, bytesTo, bytesFrom atomic.Int64
}

// plan is one copy batch for the engine.
type plan struct {
	id    tiers.BatchID
	toL2  bool
	items []tiers.PoolCopy
}

func newEnginePool(pages int, payload tiers.PayloadGeometry) *enginePool {
	return &enginePool{
		geo:   tiers.PoolGeometry{Pages: pages, Payload: payload, Device: "engine"},
		live:  map[tiers.BatchID]plan{},
		ready: make(chan struct{}, 1),
	}
}

func (p *enginePool) Geometry() tiers.PoolGeometry { return p.geo }

func (p *enginePool) CopyToSlab(ctx context.Context, b []tiers.PoolCopy) (tiers.BatchID, error) {
	return p.issue(b, true)
}

func (p *enginePool) CopyFromSlab(ctx context.Context, b []tiers.PoolCopy) (tiers.BatchID, error) {
	return p.issue(b, false)
}

func (p *enginePool) issue(b []tiers.PoolCopy, toL2 bool) (tiers.BatchID, error) {
	if p.closed {
		return 0, tiers.ErrClosed
	}
	if len(b) == 0 {
		return 0, nil
	}
	for i, c := range b {
		if c.Page < 0 || c.Page >= p.geo.Pages {
			return 0, fmt.Errorf("engine pool: item %d: page %d outside [0,%d): %w", i, c.Page, p.geo.Pages, tiers.ErrInvalid)
		}
		if int(c.Kind) < 0 || int(c.Kind) >= len(p.geo.Payload.Kinds) {
			return 0, fmt.Errorf("engine pool: item %d: kind %d of %d: %w", i, c.Kind, len(p.geo.Payload.Kinds), tiers.ErrInvalid)
		}
		if c.Span.Length != p.geo.Payload.Kinds[c.Kind].PageBytes || c.Span.Offset < 0 {
			return 0, fmt.Errorf("engine pool: item %d: span %+v is not one page of kind %d: %w", i, c.Span, c.Kind, tiers.ErrInvalid)
		}
	}
	p.next++
	pl := plan{id: p.next, toL2: toL2, items: append([]tiers.PoolCopy(nil), b...)}
	p.live[pl.id] = pl
	p.out = append(p.out, pl)
	return pl.id, nil
}

// take returns the plans issued since the last take.
func (p *enginePool) take() []plan {
	out := p.out
	p.out = nil
	return out
}

// known reports whether plan id is issued and not yet reported.
func (p *enginePool) known(id tiers.BatchID) bool {
	_, ok := p.live[id]
	return ok
}

// complete acks every item of plan id, copied or failed. It returns false
// for a plan that is not live.
func (p *enginePool) complete(id tiers.BatchID, ok bool, why error) bool {
	pl, live := p.live[id]
	if !live {
		return false
	}
	delete(p.live, id)
	st := tiers.AckCopied
	if ok {
		p.countCopied(pl)
		why = nil
	} else {
		st = tiers.AckFailed
		if why == nil {
			why = fmt.Errorf("engine reported plan %d failed", id)
		}
	}
	for i := range pl.items {
		p.acks = append(p.acks, tiers.Ack{Batch: id, Index: i, Stage: st, Err: why})
	}
	select {
	case p.ready <- struct{}{}:
	default:
	}
	return true
}

// countCopied adds a plan reported copied to the counters.
func (p *enginePool) countCopied(pl plan) {
	var b int64
	for _, it := range pl.items {
		b += it.Span.Length
	}
	if pl.toL2 {
		p.toSlab.Add(int64(len(pl.items)))
		p.bytesTo.Add(b)
	} else {
		p.fromSlab.Add(int64(len(pl.items)))
		p.bytesFrom.Add(b)
	}
}

// failAll fails every live plan (the session that owed them is gone).
func (p *enginePool) failAll(why error) int {
	n := 0
	for id := range p.live {
		p.complete(id, false, why)
		n++
	}
	p.out = nil
	return n
}

func (p *enginePool) DrainAcks(dst []tiers.Ack) []tiers.Ack {
	dst = append(dst, p.acks...)
	p.acks = p.acks[:0]
	return dst
}

func (p *enginePool) AckReady() <-chan struct{} { return p.ready }

func (p *enginePool) Stats() tiers.PoolStats {
	return tiers.PoolStats{PagesToSlab: p.toSlab.Load(), PagesFromSlab: p.fromSlab.Load(), BytesToSlab: p.bytesTo.Load(), BytesFromSlab: p.bytesFrom.Load()}
}

func (p *enginePool) Close() error {
	p.closed = true
	return nil
}

package l1cuda

import (
	"context"
	"fmt"
	"sync"

	"github.com/kvtier/kvtier/tiers"
)

// layout is the layer-first geometry shared by the pools.
type layout struct {
	pages  int
	layers int
	kinds  []tiers.PayloadSpec
}

// newLayout checks that every payload splits into layers equal slices.
func newLayout(pages, layers int, g tiers.PayloadGeometry) (layout, error) {
	if pages < 1 {
		return layout{}, fmt.Errorf("pool pages %d: must be at least 1: %w", pages, tiers.ErrInvalid)
	}
	if layers < 1 {
		return layout{}, fmt.Errorf("pool layers %d: must be at least 1: %w", layers, tiers.ErrInvalid)
	}
	if len(g.Kinds) == 0 {
		return layout{}, fmt.Errorf("pool: payload geometry has no kinds: %w", tiers.ErrInvalid)
	}
	for k, spec := range g.Kinds {
		if spec.PageBytes <= 0 || spec.PageBytes%int64(layers) != 0 {
			return layout{}, fmt.Errorf("pool: payload %q (kind %d) of %d bytes does not split into %d equal layer slices: %w",
				spec.Name, k, spec.PageBytes, layers, tiers.ErrInvalid)
		}
	}
	return layout{pages: pages, layers: layers, kinds: g.Kinds}, nil
}

// slice returns the bytes of one layer slice of kind k.
func (l layout) slice(k tiers.PayloadKind) int64 {
	return l.kinds[k].PageBytes / int64(l.layers)
}

// kindBytes returns the pool memory of kind k: pages * page_bytes.
func (l layout) kindBytes(k tiers.PayloadKind) int64 {
	return int64(l.pages) * l.kinds[k].PageBytes
}

// check refuses a malformed batch whole: a page or kind out of range, a
// span whose length is not the kind's page_bytes or that the slab does
// not hold, two items of a CopyFromSlab batch writing one page and kind.
func (l layout) check(slab tiers.Slab, batch []tiers.PoolCopy, toSlab bool) error {
	type dst struct {
		page int
		kind tiers.PayloadKind
	}
	var written map[dst]int
	if !toSlab {
		written = make(map[dst]int, len(batch))
	}
	for i, c := range batch {
		if int(c.Kind) >= len(l.kinds) {
			return fmt.Errorf("pool copy item %d: payload kind %d of %d: %w", i, c.Kind, len(l.kinds), tiers.ErrInvalid)
		}
		if c.Page < 0 || c.Page >= l.pages {
			return fmt.Errorf("pool copy item %d: page %d outside the pool's %d pages: %w", i, c.Page, l.pages, tiers.ErrInvalid)
		}
		if want := l.kinds[c.Kind].PageBytes; c.Span.Length != want {
			return fmt.Errorf("pool copy item %d: span of %d bytes for a %d-byte %s page: %w", i, c.Span.Length, want, l.kinds[c.Kind].Name, tiers.ErrInvalid)
		}
		if _, err := slab.Bytes(c.Span); err != nil {
			return fmt.Errorf("pool copy item %d: %w", i, err)
		}
		if !toSlab {
			d := dst{c.Page, c.Kind}
			if j, dup := written[d]; dup {
				return fmt.Errorf("pool copy items %d and %d both write page %d kind %d: %w", j, i, c.Page, c.Kind, tiers.ErrInvalid)
			}
			written[d] = i
		}
	}
	return nil
}

// completions is the Pool v1 completion machinery every pool of this
// package shares: batch ids, the ack queue and its ready signal, stats and
// the closed state. Batches in flight are counted so Close can wait for
// them.
type completions struct {
	mu       sync.Mutex // guards next, stats and closed
	next     tiers.BatchID
	stats    tiers.PoolStats
	closed   bool
	inflight sync.WaitGroup
	acks     tiers.AckQueue
	ready    chan struct{}
}

func newCompletions() *completions { return &completions{ready: tiers.NewAckReady()} }

// begin assigns the next batch id unless the pool is closed; the caller
// must call the returned id's items' acks and then end exactly once.
func (q *completions) begin(what string) (tiers.BatchID, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0, fmt.Errorf("%s: %w", what, tiers.ErrClosed)
	}
	q.next++
	q.inflight.Add(1)
	return q.next, nil
}

// end marks a batch begun with begin as finished (all its items acked).
func (q *completions) end() { q.inflight.Done() }

// ack queues the ack of item index of batch id and counts a copied item.
func (q *completions) ack(id tiers.BatchID, index int, c tiers.PoolCopy, toSlab bool, err error) {
	q.ackSum(id, index, c, toSlab, err, 0, false)
}

// ackSum is ack with the CRC-32C of a to-slab copy's page (Ack.Sum), kept
// only when hasSum and the copy into the slab succeeded.
func (q *completions) ackSum(id tiers.BatchID, index int, c tiers.PoolCopy, toSlab bool, err error, sum uint32, hasSum bool) {
	a := newAck(id, index, err)
	a.Sum, a.HasSum = sum, hasSum && err == nil && toSlab
	var pages, bytes int64
	if err == nil {
		pages, bytes = 1, c.Span.Length
	}
	q.queue(toSlab, pages, bytes, a)
}

// newAck is the ack of item index of batch id: AckCopied, or AckFailed
// with err.
func newAck(id tiers.BatchID, index int, err error) tiers.Ack {
	if err != nil {
		return tiers.Ack{Batch: id, Index: index, Stage: tiers.AckFailed, Err: err}
	}
	return tiers.Ack{Batch: id, Index: index, Stage: tiers.AckCopied}
}

// queue counts pages copied pages of bytes bytes (toSlab or not) and then
// queues acks in their order: one lock for the count, one push.
func (q *completions) queue(toSlab bool, pages, bytes int64, acks ...tiers.Ack) {
	q.mu.Lock()
	q.stats.Add(toSlab, pages, bytes)
	q.mu.Unlock()
	// NB: counted before queued, so a drained ack is already in Stats.
	q.acks.Push(q.ready, acks...)
}

// DrainAcks appends the queued acks to dst.
func (q *completions) DrainAcks(dst []tiers.Ack) []tiers.Ack {
	return q.acks.Drain(dst)
}

// AckReady is signalled when acks were queued since the last drain.
func (q *completions) AckReady() <-chan struct{} { return q.ready }

// Stats returns the copy counters.
func (q *completions) Stats() tiers.PoolStats {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.stats
}

// refuse makes begin fail from now on without waiting for anything.
func (q *completions) refuse() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
}

// shut refuses new batches and waits for those in flight; it reports
// whether this call was the one that closed the queue.
func (q *completions) shut() bool {
	q.mu.Lock()
	first := !q.closed
	q.closed = true
	q.mu.Unlock()
	q.inflight.Wait()
	return first
}

// base is what the three pools share in front of their copy engines:
// the ack queue, the geometry and the batch admission. start runs an
// admitted, non-empty batch and returns its id.
type base struct {
	*completions
	name  string
	geo   tiers.PoolGeometry
	lay   layout
	slab  tiers.Slab
	start func(batch []tiers.PoolCopy, toSlab bool) (tiers.BatchID, error)
}

func newBase(name, device string, env tiers.Env, lay layout) base {
	return base{
		completions: newCompletions(),
		name:        name,
		geo:         tiers.PoolGeometry{Pages: lay.pages, Payload: env.Payload, Device: device},
		lay:         lay,
		slab:        env.Slab,
	}
}

// Geometry returns the pool's shape.
func (b *base) Geometry() tiers.PoolGeometry { return b.geo }

// CopyToSlab copies pool pages into slab spans (device to host).
func (b *base) CopyToSlab(ctx context.Context, batch []tiers.PoolCopy) (tiers.BatchID, error) {
	return b.submit(batch, true)
}

// CopyFromSlab copies slab spans into pool pages (host to device).
func (b *base) CopyFromSlab(ctx context.Context, batch []tiers.PoolCopy) (tiers.BatchID, error) {
	return b.submit(batch, false)
}

// submit answers an empty batch with id 0, refuses a malformed one whole
// and hands the rest to the pool's start.
func (b *base) submit(batch []tiers.PoolCopy, toSlab bool) (tiers.BatchID, error) {
	if len(batch) == 0 {
		return 0, nil
	}
	if err := b.lay.check(b.slab, batch, toSlab); err != nil {
		return 0, fmt.Errorf("%s: %w", b.name, err)
	}
	return b.start(batch, toSlab)
}

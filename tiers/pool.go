package tiers

import (
	"context"

	"github.com/kvtier/kvtier/registry"
)

// PoolV1 is the role ID of device page pools (L1).
const PoolV1 registry.TypeID = "kvtier.tier.pool.v1"

// PoolGeometry is the shape of a device pool.
type PoolGeometry struct {
	// Pages is the number of pages in the pool, addressed 0..Pages-1.
	Pages int
	// Payload is the stack's payload geometry; a pool page holds one
	// payload of each kind.
	Payload PayloadGeometry
	// Device names the device, e.g. "cuda:0" or "host".
	Device string
}

// PoolCopy moves one payload of one pool page to or from a slab span.
type PoolCopy struct {
	// Page is the pool page.
	Page int
	// Kind is the payload kind.
	Kind PayloadKind
	// Span is the slab span, exactly the payload's page_bytes.
	Span Span
}

// PoolStats counts pool traffic.
type PoolStats struct {
	// PagesToSlab and PagesFromSlab count copied payload pages.
	PagesToSlab, PagesFromSlab int64
	// BytesToSlab and BytesFromSlab count copied bytes.
	BytesToSlab, BytesFromSlab int64
}

// Add counts pages copied pages of bytes bytes in all, into the slab
// (toSlab) or out of it.
func (s *PoolStats) Add(toSlab bool, pages, bytes int64) {
	if toSlab {
		s.PagesToSlab += pages
		s.BytesToSlab += bytes
	} else {
		s.PagesFromSlab += pages
		s.BytesFromSlab += bytes
	}
}

// Pool v1 is a fixed array of device pages that the host allocates into.
// The host decides which pool page holds what; the pool only copies.
//
// Completions have the shape of a Store's, so the driver sees one kind:
// CopyToSlab and CopyFromSlab are asynchronous and return the batch's id
// (ids increase from 1, shared by both directions). Each item of a batch
// gets exactly one ack, AckCopied or AckFailed (with Err), queued inside
// the pool until the host drains them with DrainAcks at its ticks, as it
// drains a Store's acks; AckReady is signalled when the queue goes
// non-empty. The driver tags both streams with the tier and feeds them to
// the control machine as Done(op, stage, ok).
//
// Buffers: the slab span of an item is read (CopyToSlab: written) and the
// pool page written (CopyToSlab: read) until the item's ack is queued; the
// host must not reuse either before it drains that ack.
//
// A malformed batch (a page or kind out of range, a span whose length is
// not the kind's page_bytes or that lies outside the slab, two items of a
// CopyFromSlab batch writing the same page and kind) is refused whole with
// ErrInvalid: nothing is copied and no ack is queued. An empty batch
// returns id 0, copies nothing and queues nothing.
//
// A pool whose configured fast path cannot run fails at open; it never
// falls back silently to a slower one.
//
// Concurrency: all methods are safe for concurrent use. Close waits for
// in-flight copies (their acks stay drainable) and releases the pool;
// calls after Close fail with ErrClosed.
type Pool interface {
	// Geometry returns the pool's shape.
	Geometry() PoolGeometry
	// CopyToSlab starts copying pool pages into slab spans (device to
	// host) and returns the batch id.
	CopyToSlab(ctx context.Context, batch []PoolCopy) (BatchID, error)
	// CopyFromSlab starts copying slab spans into pool pages (host to
	// device) and returns the batch id.
	CopyFromSlab(ctx context.Context, batch []PoolCopy) (BatchID, error)
	// DrainAcks appends all queued acks to dst and returns it. It never
	// blocks.
	DrainAcks(dst []Ack) []Ack
	// AckReady returns a channel that receives a value whenever acks were
	// queued since the last drain.
	AckReady() <-chan struct{}
	// Stats returns counters.
	Stats() PoolStats
	// Close waits for in-flight copies and releases the pool.
	Close() error
}

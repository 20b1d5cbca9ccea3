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

// Completion is the handle of an asynchronous batch.
type Completion interface {
	// Done is closed when the batch has finished, successfully or not.
	Done() <-chan struct{}
	// Err reports the batch's result once Done is closed.
	Err() error
}

// PoolStats counts pool traffic.
type PoolStats struct {
	// PagesToSlab and PagesFromSlab count copied payload pages.
	PagesToSlab, PagesFromSlab int64
	// BytesToSlab and BytesFromSlab count copied bytes.
	BytesToSlab, BytesFromSlab int64
}

// Pool v1 is a fixed array of device pages that the host allocates into.
// The host decides which pool page holds what; the pool only copies.
//
// Buffers: the slab spans named in a batch are read (ToSlab: written) until
// the batch's Completion is done; the host must not reuse them before.
// A pool whose fast path cannot run fails at open, never falls back
// silently to a slower one.
type Pool interface {
	// Geometry returns the pool's shape.
	Geometry() PoolGeometry
	// CopyToSlab copies pool pages into slab spans (device to host).
	CopyToSlab(ctx context.Context, batch []PoolCopy) (Completion, error)
	// CopyFromSlab copies slab spans into pool pages (host to device).
	CopyFromSlab(ctx context.Context, batch []PoolCopy) (Completion, error)
	// Stats returns counters.
	Stats() PoolStats
	// Close waits for in-flight copies and releases the pool.
	Close() error
}

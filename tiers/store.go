package tiers

import (
	"context"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/registry"
)

// StoreV1 is the role ID of content-addressed tiers below the slab.
const StoreV1 registry.TypeID = "kvtier.tier.store.v1"

// BatchID identifies one Put call on one Store, or one copy call on one
// Pool; ids increase from 1.
type BatchID uint64

// PutRequest writes one payload of one page from a slab span.
type PutRequest struct {
	// Key is the page hash and payload kind the bytes are stored under.
	Key Key
	// Src holds exactly the payload's page_bytes. The store reads it until
	// the item's AckGathered (or AckFailed); after that the host may reuse it.
	Src Span
	// Sum is the producer's CRC-32C (Castagnoli) of exactly Src's bytes as
	// the producer wrote them, taken where it read them anyway (the store
	// door's Commit). It is meaningful only when HasSum is set.
	//
	// A store that keeps a per-page checksum stores Sum as given instead
	// of computing its own over what it gathered, and says so by
	// implementing SumKeeper. Bytes that changed in the slab after the
	// producer's sum then read back as a miss, never as a valid-looking
	// copy: the checksum travels with the page and is never recomputed
	// over bytes nobody vouched for. With HasSum false a store computes
	// its own checksum, as before. Every read verifies either way.
	//
	// Sum and HasSum are a backward-compatible minor addition to
	// kvtier.tier.store.v1: a store that predates them ignores them and
	// keeps computing its own (the host then cannot rely on the sum
	// travelling; it checks the slab again at AckGathered instead).
	Sum uint32
	// HasSum says Sum is set.
	HasSum bool
}

// SumKeeper is the optional ability of a Store that honours
// PutRequest.Sum: it stores the producer's checksum as given and verifies
// every read against it, so a page whose slab bytes changed after the sum
// was taken reads back as a miss. A host that puts with sums may then skip
// its own check of the slab at AckGathered. A store that cannot carry the
// sum (a plugin whose protocol drops the field) must not implement it, or
// must return false.
type SumKeeper interface {
	// KeepsPutSums reports whether Put stores PutRequest.Sum as given
	// when HasSum is set.
	KeepsPutSums() bool
}

// GetRequest reads one payload of one page into a slab span.
type GetRequest struct {
	// Key is the page hash and payload kind to read.
	Key Key
	// Dst receives exactly the payload's page_bytes. A hit leaves the
	// verified bytes there; on a miss its content is unspecified (the
	// store may have copied bytes that then failed their check; the host
	// does not expose it: the page is not inserted).
	Dst Span
	// Sum and HasSum are outputs: a store that verified the page against
	// a checksum it keeps (a SumKeeper) sets Sum to that CRC-32C of the
	// bytes it left in Dst and HasSum on a hit, so the host need not read
	// the page again for it. A store that keeps none leaves them unset.
	// A backward-compatible minor addition, as PutRequest.Sum.
	Sum    uint32
	HasSum bool
}

// AckStage is the stage a Put item reached.
type AckStage uint8

const (
	// AckGathered: the store has copied the item's bytes out of the slab
	// (into its own staging buffer). The slab span may now be reused.
	AckGathered AckStage = iota + 1
	// AckDurable: the item is stored and indexed; a Get after a restart
	// with cold start "load" finds it. Terminal.
	AckDurable
	// AckFailed: the item was not stored (a Pool: not copied); Err says
	// why. Terminal. If it comes before AckGathered the slab span is
	// released all the same.
	AckFailed
	// AckCopied: a Pool copy item finished; the destination holds the
	// bytes and both the source and the destination may be reused.
	// Terminal. Only pools send it.
	AckCopied
)

// String returns the stage name.
func (s AckStage) String() string {
	switch s {
	case AckGathered:
		return "gathered"
	case AckDurable:
		return "durable"
	case AckFailed:
		return "failed"
	case AckCopied:
		return "copied"
	}
	return "unknown"
}

// Ack reports the progress of one item of one Put batch (a Store) or one
// copy batch (a Pool).
type Ack struct {
	// Batch is the id Put (a Pool: the copy call) returned.
	Batch BatchID
	// Index is the item's position in that batch.
	Index int
	// Stage is the stage reached.
	Stage AckStage
	// Err is set only for AckFailed.
	Err error
	// Sum, when HasSum, is the CRC-32C (Castagnoli) of the page as a
	// Pool's to-slab copy wrote it into its slab span, taken where the
	// copy already read the bytes (an AckCopied only; a Store never sets
	// it). The host carries it on the Put that spills the page
	// (PutRequest.Sum), so a page changed in the slab afterwards is a
	// miss below it, never stored under a checksum of the changed bytes.
	Sum    uint32
	HasSum bool
}

// ColdStart says what a store does with data left by a previous run.
type ColdStart string

const (
	// ColdStartClear starts empty: everything left behind is invisible
	// (for the disk store, an epoch bump; O(1)).
	ColdStartClear ColdStart = "clear"
	// ColdStartLoad keeps what was durable: the store rebuilds its
	// bookkeeping from what it finds, dropping whatever fails verification.
	ColdStartLoad ColdStart = "load"
)

// StoreStats is a point-in-time summary of a store.
type StoreStats struct {
	// Pages and Bytes count stored payload pages and their payload bytes.
	Pages, Bytes int64
	// CapacityBytes is the configured capacity, 0 if unbounded.
	CapacityBytes int64
	// Hits and Misses count Get items since open; Corrupt counts the
	// misses that were verification failures.
	Hits, Misses, Corrupt int64
	// Puts, PutFailures and Evictions count Put items and pages evicted
	// by the store's own garbage collection since open.
	Puts, PutFailures, Evictions int64
}

// Store v1 is a content-addressed tier below the slab (L3 disk, a remote
// store, a plugin). Keys are page hashes plus payload kind.
//
// Batching: every operation takes a batch; a batch of one is legal but
// implementations may cost a fixed overhead per call (a plugin call is about
// 140 µs), so the host batches.
//
// Buffers: a Store reads Put sources and writes Get destinations through
// the Slab it was opened with (Env.Slab). Put sources are read until the
// item's AckGathered or AckFailed; Get destinations only until Get returns.
// Request slices are not retained after the call returns.
//
// Completions: Put is asynchronous. Each item produces at most one
// AckGathered followed by exactly one terminal ack (AckDurable or AckFailed).
// Acks are queued inside the store until the host drains them with
// DrainAcks, which it does at ticks (acks are rank-local facts and become
// replicated only through the tick frontier). AckReady is signalled when
// the queue goes non-empty, so a host can also wait for progress.
//
// Concurrency: all methods are safe for concurrent use. Close waits for
// in-flight work; Put items not yet durable are acknowledged AckFailed
// with ErrClosed.
type Store interface {
	// Put starts storing the batch and returns its id. A returned error
	// means no item of the batch was accepted (and none will be acked).
	Put(ctx context.Context, batch []PutRequest) (BatchID, error)
	// Get reads the batch into the destination spans. results must have
	// len(batch); results[i] is nil for a verified hit or wraps ErrMiss.
	// A returned error means the call failed as a whole.
	Get(ctx context.Context, batch []GetRequest, results []error) error
	// LongestPrefix returns how many leading hashes of chain are present
	// for kind (a later page may be present after a missing one; it does
	// not count).
	LongestPrefix(ctx context.Context, kind PayloadKind, chain []pagehash.Hash) (int, error)
	// Delete removes keys; absent keys are not an error.
	Delete(ctx context.Context, keys []Key) error
	// Touch marks keys as recently used for the store's own eviction.
	Touch(ctx context.Context, keys []Key) error
	// DrainAcks appends all queued acks to dst and returns it. It never
	// blocks.
	DrainAcks(dst []Ack) []Ack
	// AckReady returns a channel that receives a value whenever acks were
	// queued since the last drain.
	AckReady() <-chan struct{}
	// Stats returns counters.
	Stats() StoreStats
	// Close stops the store and releases its resources.
	Close() error
}

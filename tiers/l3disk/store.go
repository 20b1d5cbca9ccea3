package l3disk

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/internal/ratelog"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
)

// Store is the L3 disk tier: Store v1 over preallocated slab files of
// fixed-size slots on one disk, located through an Index v1.
//
// Goroutines: gatherers copy put sources from the slab into aligned
// staging buffers (then ack gathered); the writer owns the slot pools,
// the LRU and garbage collection and dispatches writes; Depth I/O workers
// write slots; a syncer makes groups of written slots durable (fdatasync)
// and then indexes them, in that order. Gets run on the caller's goroutine
// with up to Depth reads in flight.
type Store struct {
	env       tiers.Env
	cfg       Config
	log       *slog.Logger
	fs        diskfs.FS
	index     indexes.Index
	slab      tiers.Slab
	disk      int
	rank      int
	files     []*slabFile
	pageBytes []int64
	coldStart tiers.ColdStart
	// rebuildMark names the file that says an index rebuild of this store
	// has not finished (see RebuildMarkName).
	rebuildMark string
	plp         PLPResult
	direct      bool

	staging  chan *diskfs.AlignedBuffer
	readBufs chan *diskfs.AlignedBuffer
	reads    chan func()    // Get's slot reads, run by Depth getLoops
	checks   chan func()    // Get's checks and copies, run by CPUs-1 getLoops
	checkWG  sync.WaitGroup // getLoops
	allBufs  []*diskfs.AlignedBuffer

	nextBatch atomic.Uint64

	gatherMu  sync.Mutex
	gatherQ   []putItem
	gatherSig chan struct{}

	gathered chan *writeJob
	ioJobs   chan *writeJob
	written  chan *writeJob
	commits  chan []*writeJob

	ctlMu  sync.Mutex
	ctlQ   []ctlOp
	ctlSig chan struct{}

	// Owned by the writer goroutine (and by Open before it starts).
	pools     []*slotPool
	inflight  map[tiers.Key]*writeJob
	inflightN int
	gcActive  []bool
	// indexCap[k] is the pages of kind k that were in use when the index
	// last refused a put of that kind as full (0: never). GC then treats
	// it as the kind's capacity, so a map smaller than the slabs need
	// makes a cache bounded by its index, not one that stops storing.
	indexCap []int
	// verified marks live slots whose payload CRC was checked since open
	// (written in this run, rebuilt, or verified on a dedup): a put is
	// deduplicated only against such a slot, so a durable ack is true.
	verified [][]bool
	// rebuilt is what the cold start's index rebuild did.
	rebuilt RebuildCounts

	// clock is the store's logical access clock: bumped by the writer
	// for LRU order, read by the syncer for the index's LastAccess.
	clock atomic.Uint64

	acks     tiers.AckQueue
	ackReady chan struct{}

	closeMu  sync.RWMutex
	closed   atomic.Bool
	stop     chan struct{}
	gatherWG sync.WaitGroup
	writerWG sync.WaitGroup
	ioWG     sync.WaitGroup
	syncWG   sync.WaitGroup
	bgWG     sync.WaitGroup
	bgCancel context.CancelFunc

	// zeroCopy: pages of whole blocks move between the disk and the slab
	// span directly (Config.ZeroCopy resolved against the slab).
	zeroCopy bool

	st      counters
	limiter *ratelog.Log
}

// counters are the store's statistics.
type counters struct {
	hits, misses, corrupt      atomic.Int64
	puts, putFailures, evicted atomic.Int64
	// indexFullCaps counts the times the index refusing a put as full
	// set a new capacity for GC (indexCap).
	indexFullCaps           atomic.Int64
	livePages, liveBytes    atomic.Int64
	writeErrors, readErrors atomic.Int64
	dedups, staleDropped    atomic.Int64
	usedSlots               []atomic.Int64
	spillBytes, reloadBytes atomic.Int64
	// directWrites and directReads count payloads that moved between the
	// disk and the caller's slab span with no staging copy (a format 2
	// file, pages of whole blocks, block-aligned spans).
	directWrites, directReads   atomic.Int64
	indexErrors, gcIndexErrors  atomic.Int64
	syncs, syncedWrites         atomic.Int64
	loadLive, loadOrphan        atomic.Int64
	loadDropped, loadStaleEntry atomic.Int64
}

type putItem struct {
	batch tiers.BatchID
	index int
	key   tiers.Key
	// src is the slab span the page is read from: by the gatherer's copy
	// into a staging buffer, or (direct) by the disk write itself.
	src []byte
	// sum is the producer's CRC-32C of src, when hasSum: the slot header
	// takes it as given (tiers.PutRequest.Sum).
	sum    uint32
	hasSum bool
}

// writeJob is one page on its way to disk, with any duplicate puts of the
// same key that arrived while it was in flight.
type writeJob struct {
	key   tiers.Key
	items []putItem
	// buf is the staging buffer: the whole slot, or (direct) only its
	// header block.
	buf *diskfs.AlignedBuffer
	// direct: the payload is written straight from own.src, so the slab
	// span is read until the write returns, and own's AckGathered is
	// sent only then (or when the job ends without a write). own is the
	// job's first item as it was made: items may grow on the writer
	// while the write runs.
	direct  bool
	own     putItem
	slot    int32
	err     error
	dropped bool        // a reader found it corrupt and removed its entry
	deletes []*deleteOp // Delete calls waiting for it to land
}

type ctlKind uint8

const (
	ctlTouch ctlKind = iota + 1
	ctlDelete
	ctlCorrupt
	// ctlCall runs fn on the writer goroutine (consistency checks).
	ctlCall
)

type ctlOp struct {
	kind ctlKind
	keys []tiers.Key
	del  *deleteOp
	// corrupt: the record a reader removed from the index.
	rec indexes.Record
	key tiers.Key
	fn  func()
}

type deleteOp struct {
	pending int
	err     error
	done    chan error
}

// SyncStats returns how many slab fdatasyncs the store has issued and how
// many slot writes they made durable: their ratio is the average group
// commit size.
func (s *Store) SyncStats() (syncs, writes int64) {
	return s.st.syncs.Load(), s.st.syncedWrites.Load()
}

// DirectTransfers returns how many page writes and verified reads moved
// the payload straight between the disk and the slab, with no staging
// copy.
func (s *Store) DirectTransfers() (writes, reads int64) {
	return s.st.directWrites.Load(), s.st.directReads.Load()
}

// Disk returns the disk number this store writes.
func (s *Store) Disk() int { return s.disk }

// PLP returns the power-loss-protection probe result (zero if skipped).
func (s *Store) PLP() PLPResult { return s.plp }

// Direct reports whether the store's slab files use O_DIRECT.
func (s *Store) Direct() bool { return s.direct }

// ReadOnly returns, per payload kind, the error that made its slab
// read-only, or nil for a writable slab.
func (s *Store) ReadOnly() []error {
	out := make([]error, len(s.files))
	for k, f := range s.files {
		out[k] = f.readOnlyErr()
	}
	return out
}

// SlabPaths returns the slab file of each payload kind.
func (s *Store) SlabPaths() []string {
	out := make([]string, len(s.files))
	for k, f := range s.files {
		out[k] = f.path
	}
	return out
}

func (s *Store) enter() error {
	s.closeMu.RLock()
	if s.closed.Load() {
		s.closeMu.RUnlock()
		return fmt.Errorf("l3disk: %w", tiers.ErrClosed)
	}
	return nil
}

func (s *Store) leave() { s.closeMu.RUnlock() }

func (s *Store) kindBytes(k tiers.PayloadKind) (int64, error) {
	if int(k) >= len(s.files) {
		return 0, fmt.Errorf("payload kind %d: store has %d kinds: %w", k, len(s.files), tiers.ErrInvalid)
	}
	return s.pageBytes[k], nil
}

func (s *Store) spanBytes(key tiers.Key, sp tiers.Span) ([]byte, error) {
	pb, err := s.kindBytes(key.Kind)
	if err != nil {
		return nil, err
	}
	if sp.Length != pb {
		return nil, fmt.Errorf("key %s: span of %d bytes, payload kind %d has %d: %w", key, sp.Length, key.Kind, pb, tiers.ErrInvalid)
	}
	b, err := s.slab.Bytes(sp)
	if err != nil {
		return nil, fmt.Errorf("key %s: span %d@%d+%d: %w", key, sp.Slab, sp.Offset, sp.Length, err)
	}
	if int64(len(b)) != pb {
		return nil, fmt.Errorf("key %s: slab returned %d bytes for a %d-byte span: %w", key, len(b), pb, tiers.ErrInvalid)
	}
	return b, nil
}

// logInterval is how often one kind of fault is logged at most.
const logInterval = 10 * time.Second

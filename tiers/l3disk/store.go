package l3disk

import (
	"github.com/kvtier/kvtier/internal/ratelog"

	"github.com/kvtier/kvtier/internal/invariants"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/pagehash"
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
	plp       PLPResult
	direct    bool

	staging  chan *diskfs.AlignedBuffer
	readBufs chan *diskfs.AlignedBuffer
	readSem  chan struct{} // reads in flight, at most Depth
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

	// clock is the store's logical access clock: bumped by the writer
	// for LRU order, read by the syncer for the index's LastAccess.
	clock atomic.Uint64

	ackMu    sync.Mutex
	acks     []tiers.Ack
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

	st      counters
	limiter *ratelog.Log
}

// counters are the store's statistics.
type counters struct {
	hits, misses, corrupt       atomic.Int64
	puts, putFailures, evicted  atomic.Int64
	livePages, liveBytes        atomic.Int64
	writeErrors, readErrors     atomic.Int64
	dedups, staleDropped        atomic.Int64
	usedSlots                   []atomic.Int64
	spillBytes, reloadBytes     atomic.Int64
	indexErrors, gcIndexErrors  atomic.Int64
	syncs, syncedWrites         atomic.Int64
	loadLive, loadOrphan        atomic.Int64
	loadDropped, loadStaleEntry atomic.Int64
}

type putItem struct {
	batch tiers.BatchID
	index int
	key   tiers.Key
	src   []byte
}

// writeJob is one page on its way to disk, with any duplicate puts of the
// same key that arrived while it was in flight.
type writeJob struct {
	key     tiers.Key
	items   []putItem
	buf     *diskfs.AlignedBuffer
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

// Open opens the store on the real file system.
func Open(ctx context.Context, env tiers.Env, cfg Config) (*Store, error) {
	return OpenFS(ctx, env, cfg, diskfs.OS{})
}

// OpenFS opens the store doing its file I/O through fs (tests inject
// faults with package errorfs).
func OpenFS(ctx context.Context, env tiers.Env, cfg Config, fs diskfs.FS) (st *Store, err error) {
	if err := env.Validate(); err != nil {
		return nil, fmt.Errorf("l3disk open: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if env.Slab == nil {
		return nil, fmt.Errorf("l3disk open: env has no slab to read and write pages through: %w", tiers.ErrInvalid)
	}
	if env.Index == nil {
		return nil, fmt.Errorf("l3disk open: env has no index (the stack entry needs an index: block): %w", tiers.ErrInvalid)
	}
	if len(env.Payload.Kinds) > 256 {
		return nil, fmt.Errorf("l3disk open: %d payload kinds, at most 256: %w", len(env.Payload.Kinds), tiers.ErrInvalid)
	}
	if env.Rank > 0xffff {
		// NB: the rank lives in an epoch's low 16 bits (epochFor).
		return nil, fmt.Errorf("l3disk open: rank %d: at most 65535 ranks: %w", env.Rank, tiers.ErrInvalid)
	}
	stackID := env.StackID
	if stackID == "" {
		stackID = "default"
	}
	if !stackIDPattern.MatchString(stackID) {
		return nil, fmt.Errorf("l3disk open: stack id %q: want 1-64 of [A-Za-z0-9._-] (it names slab files): %w", stackID, tiers.ErrInvalid)
	}
	disk, ranksOnDisk, err := cfg.DiskForRank(env.Rank, env.WorldSize)
	if err != nil {
		return nil, err
	}
	slots, err := cfg.SlotsPerKind(disk, ranksOnDisk, env.Payload)
	if err != nil {
		return nil, err
	}
	if slots > 1<<31-1 {
		return nil, fmt.Errorf("l3disk open: %d slots per kind, at most %d", slots, 1<<31-1)
	}
	dir := cfg.Disks[disk].Dir
	if err := fs.MkdirAll(dir); err != nil {
		return nil, fmt.Errorf("l3disk open: %w", err)
	}
	mode := cfg.ColdStart
	if mode == "" {
		mode = env.ColdStart
	}
	if mode == "" {
		mode = tiers.ColdStartClear
	}
	if mode != tiers.ColdStartClear && mode != tiers.ColdStartLoad {
		return nil, fmt.Errorf("l3disk open: cold start %q, want clear or load: %w", mode, tiers.ErrInvalid)
	}
	s := &Store{
		env: env, cfg: cfg, log: env.Logger.With("tier", "l3disk", "rank", env.Rank, "disk", disk),
		fs: fs, index: env.Index, slab: env.Slab, disk: disk, rank: env.Rank, coldStart: mode,
		gatherSig: make(chan struct{}, 1),
		ctlSig:    make(chan struct{}, 1),
		ackReady:  make(chan struct{}, 1),
		stop:      make(chan struct{}),
		inflight:  make(map[tiers.Key]*writeJob),
	}
	s.limiter = ratelog.New(s.log, logInterval)
	s.st.usedSlots = make([]atomic.Int64, len(env.Payload.Kinds))
	defer func() {
		if err != nil {
			err = errors.Join(err, s.release())
		}
	}()

	if cfg.PLPProbes > 0 {
		s.plp, err = ProbePLP(fs, dir, cfg.PLPProbes, cfg.ODirect, cfg.PLPMaxSync)
		if err != nil {
			return nil, fmt.Errorf("l3disk open: %w", err)
		}
		s.log.Info("l3 power-loss-protection probe", "dir", dir, "median_sync", s.plp.Median, "plp", s.plp.Protected)
		if cfg.RequirePLP && !s.plp.Protected {
			return nil, fmt.Errorf("l3disk open: disk %s: median 4 KiB write+fdatasync %v over %d probes exceeds plp_max_sync %v, so the disk is probably not power-loss protected and require_plp is set: %w",
				dir, s.plp.Median, s.plp.Probes, cfg.PLPMaxSync, ErrNoPLP)
		}
	}

	maxSlot := int64(0)
	refused := false
	for k, spec := range env.Payload.Kinds {
		want := superblock{
			Kind: uint8(k), Rank: uint32(env.Rank), PageBytes: spec.PageBytes,
			SlotBytes: SlotBytes(spec.PageBytes), Slots: slots,
			Epoch: epochFor(1, env.Rank), StackID: stackID,
		}
		path := filepath.Join(dir, SlabFileName(stackID, env.Rank, uint8(k)))
		f, created, directRefused, err := openSlabFile(fs, path, want, openMode{
			direct: cfg.ODirect, recreate: mode == tiers.ColdStartClear, create: true, depth: cfg.Depth,
		})
		if err != nil {
			return nil, fmt.Errorf("l3disk open: %w", err)
		}
		s.files = append(s.files, f)
		s.pageBytes = append(s.pageBytes, spec.PageBytes)
		refused = refused || directRefused
		if created {
			s.log.Info("l3 slab file created", "path", path, "kind", spec.Name, "slots", slots, "slot_bytes", want.SlotBytes)
		}
		maxSlot = max(maxSlot, want.SlotBytes)
		s.pools = append(s.pools, newSlotPool(int(slots)))
		s.gcActive = append(s.gcActive, false)
	}
	s.direct = !refused && cfg.ODirect != ODirectOff
	if refused {
		s.log.Warn("l3 o_direct refused by the file system; using buffered I/O with fdatasync", "dir", dir)
	}

	// Buffers: 2×depth staging (gather overlaps writes) and 2×depth read
	// buffers (verification and the copy out overlap the next Depth
	// reads in flight).
	s.staging = make(chan *diskfs.AlignedBuffer, 2*cfg.Depth)
	s.readBufs = make(chan *diskfs.AlignedBuffer, 2*cfg.Depth)
	s.readSem = make(chan struct{}, cfg.Depth)
	for i := range 4 * cfg.Depth {
		b, err := diskfs.NewAlignedBuffer(int(maxSlot))
		if err != nil {
			return nil, fmt.Errorf("l3disk open: staging: %w", err)
		}
		s.allBufs = append(s.allBufs, b)
		if i < 2*cfg.Depth {
			s.staging <- b
		} else {
			s.readBufs <- b
		}
	}

	switch mode {
	case tiers.ColdStartClear:
		for _, f := range s.files {
			if err := f.bumpEpoch(); err != nil {
				return nil, fmt.Errorf("l3disk open: cold start clear: %w", err)
			}
		}
		s.log.Info("l3 cold start clear: epoch bumped, all slots free")
	case tiers.ColdStartLoad:
		if err := s.load(ctx); err != nil {
			return nil, fmt.Errorf("l3disk open: cold start load: %w", err)
		}
	}

	s.gathered = make(chan *writeJob, cfg.Depth)
	s.ioJobs = make(chan *writeJob)
	// NB: written is deep enough that a slow fdatasync or index commit
	// never blocks the I/O workers: writes keep the device busy while
	// the syncer makes the previous group durable, and groups grow.
	s.written = make(chan *writeJob, maxSyncGroup)
	s.commits = make(chan []*writeJob, 4)
	// Gatherers copy and checksum pages (memory-bound work); one per
	// core up to Depth, so a many-core host is not capped at one core's
	// memcpy rate.
	for range max(1, min(cfg.Depth, runtime.GOMAXPROCS(0))) {
		s.gatherWG.Add(1)
		go s.gatherLoop()
	}
	go func() {
		s.gatherWG.Wait()
		close(s.gathered)
	}()
	s.writerWG.Add(1)
	go s.writerLoop()
	for range cfg.Depth {
		s.ioWG.Add(1)
		go s.ioLoop()
	}
	s.syncWG.Add(1)
	go s.syncLoop()
	bg, cancel := context.WithCancel(context.Background())
	s.bgCancel = cancel
	if mode == tiers.ColdStartClear {
		s.bgWG.Add(1)
		go func() {
			defer s.bgWG.Done()
			s.sweepStale(bg)
		}()
	}
	if r := env.Registerer; r != nil {
		if err := r.Register(newCollector(s)); err != nil {
			s.log.Warn("l3 metrics not registered", "err", err)
		}
	}
	return s, nil
}

// release frees what Open acquired, for a failed Open and for Close.
func (s *Store) release() error {
	var errs []error
	for _, f := range s.files {
		errs = append(errs, f.close())
	}
	s.files = nil
	for _, b := range s.allBufs {
		errs = append(errs, b.Free())
	}
	s.allBufs = nil
	return errors.Join(errs...)
}

// SyncStats returns how many slab fdatasyncs the store has issued and how
// many slot writes they made durable: their ratio is the average group
// commit size.
func (s *Store) SyncStats() (syncs, writes int64) {
	return s.st.syncs.Load(), s.st.syncedWrites.Load()
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

// Put implements tiers.Store.
func (s *Store) Put(_ context.Context, batch []tiers.PutRequest) (tiers.BatchID, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.leave()
	items := make([]putItem, len(batch))
	for i, r := range batch {
		src, err := s.spanBytes(r.Key, r.Src)
		if err != nil {
			return 0, fmt.Errorf("l3disk put item %d: %w", i, err)
		}
		items[i] = putItem{index: i, key: r.Key, src: src}
	}
	id := tiers.BatchID(s.nextBatch.Add(1))
	for i := range items {
		items[i].batch = id
	}
	s.gatherMu.Lock()
	s.gatherQ = append(s.gatherQ, items...)
	s.gatherMu.Unlock()
	signal(s.gatherSig)
	return id, nil
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (s *Store) ack(a ...tiers.Ack) {
	s.ackMu.Lock()
	s.acks = append(s.acks, a...)
	s.ackMu.Unlock()
	signal(s.ackReady)
}

func (s *Store) failItems(items []putItem, err error) {
	acks := make([]tiers.Ack, len(items))
	for i, it := range items {
		acks[i] = tiers.Ack{Batch: it.batch, Index: it.index, Stage: tiers.AckFailed, Err: err}
	}
	s.st.putFailures.Add(int64(len(items)))
	s.ack(acks...)
}

// DrainAcks implements tiers.Store.
func (s *Store) DrainAcks(dst []tiers.Ack) []tiers.Ack {
	s.ackMu.Lock()
	dst = append(dst, s.acks...)
	clear(s.acks)
	s.acks = s.acks[:0]
	s.ackMu.Unlock()
	return dst
}

// AckReady implements tiers.Store.
func (s *Store) AckReady() <-chan struct{} { return s.ackReady }

// gatherLoop copies put sources into staging buffers. Several run; each
// takes the oldest queued item.
func (s *Store) gatherLoop() {
	defer s.gatherWG.Done()
	for {
		s.gatherMu.Lock()
		var it putItem
		have := len(s.gatherQ) > 0
		more := false
		if have {
			it = s.gatherQ[0]
			s.gatherQ[0] = putItem{}
			s.gatherQ = s.gatherQ[1:]
			more = len(s.gatherQ) > 0
		}
		s.gatherMu.Unlock()
		if more {
			// Wake another gatherer for the rest: one signal per Put would
			// otherwise leave all but one of them asleep.
			signal(s.gatherSig)
		}
		if !have {
			select {
			case <-s.gatherSig:
				continue
			case <-s.stop:
				s.failQueued()
				return
			}
		}
		var buf *diskfs.AlignedBuffer
		select {
		case buf = <-s.staging:
		case <-s.stop:
			s.failItems([]putItem{it}, fmt.Errorf("l3disk put %s: %w", it.key, tiers.ErrClosed))
			s.failQueued()
			return
		}
		f := s.files[it.key.Kind]
		pb := s.pageBytes[it.key.Kind]
		b := buf.Bytes()
		copy(b[HeaderSize:HeaderSize+pb], it.src)
		end := f.sb.SlotBytes
		clear(b[HeaderSize+pb : end])
		SlotHeader{
			Kind: uint8(it.key.Kind), Epoch: f.epoch(), Hash: it.key.Hash,
			PayloadLen: uint32(pb), PayloadCRC: PayloadCRC(b[HeaderSize : HeaderSize+pb]),
		}.Encode(b)
		s.ack(tiers.Ack{Batch: it.batch, Index: it.index, Stage: tiers.AckGathered})
		job := &writeJob{key: it.key, items: []putItem{it}, buf: buf, slot: noSlot}
		select {
		case s.gathered <- job:
		case <-s.stop:
			s.staging <- buf
			s.failItems(job.items, fmt.Errorf("l3disk put %s: %w", it.key, tiers.ErrClosed))
			s.failQueued()
			return
		}
	}
}

func (s *Store) failQueued() {
	s.gatherMu.Lock()
	q := s.gatherQ
	s.gatherQ = nil
	s.gatherMu.Unlock()
	if len(q) > 0 {
		s.failItems(q, fmt.Errorf("l3disk put: %w", tiers.ErrClosed))
	}
}

// writerLoop owns the slot pools, the LRU and GC.
func (s *Store) writerLoop() {
	defer s.writerWG.Done()
	defer close(s.ioJobs)
	gathered := s.gathered
	for gathered != nil || s.inflightN > 0 {
		select {
		case job, ok := <-gathered:
			if !ok {
				gathered = nil
				continue
			}
			s.handleCtl()
			s.handleGathered(job)
		case res := <-s.commits:
			s.handleCommits(res)
		case <-s.ctlSig:
			s.handleCtl()
		}
		if invariants.Enabled {
			s.checkPools()
		}
	}
	s.handleCtl()
}

// checkPools panics with the violation if a slot pool's invariants are
// broken (invariant builds only: it is O(slots) per writer step).
func (s *Store) checkPools() {
	for k, p := range s.pools {
		if err := p.check(); err != nil {
			panic(fmt.Sprintf("l3disk: slot pool of kind %d: %v", k, err))
		}
		if got := s.st.usedSlots[k].Load(); got != int64(p.used()) {
			panic(fmt.Sprintf("l3disk: kind %d used-slots counter %d, pool says %d", k, got, p.used()))
		}
	}
}

func (s *Store) releaseStaging(job *writeJob) {
	if job.buf != nil {
		s.staging <- job.buf
		job.buf = nil
	}
}

func (s *Store) handleGathered(job *writeJob) {
	k := job.key.Kind
	f, pool := s.files[k], s.pools[k]
	if err := f.readOnlyErr(); err != nil {
		s.releaseStaging(job)
		s.failItems(job.items, fmt.Errorf("l3disk put %s: %w: %w", job.key, tiers.ErrBroken, err))
		return
	}
	if slot, ok := pool.lookup(job.key.Hash); ok {
		switch {
		case pool.state[slot] == slotInFlight:
			s.releaseStaging(job)
			s.st.dedups.Add(int64(len(job.items)))
			other := s.inflight[job.key]
			other.items = append(other.items, job.items...)
			return
		case s.indexNames(job.key, slot):
			s.releaseStaging(job)
			s.st.dedups.Add(int64(len(job.items)))
			pool.touch(slot, s.clock.Add(1))
			s.ackDurable(job.items)
			return
		default:
			// NB: a reader dropped this page's entry (its slot failed
			// verification) and its notice has not reached us yet: a
			// durable ack now would be a lie. Free the slot and write
			// the page again.
			s.freeLive(k, slot)
		}
	}
	s.collect(k)
	slot, ok := pool.alloc(job.key.Hash)
	if !ok {
		s.releaseStaging(job)
		s.failItems(job.items, fmt.Errorf("l3disk put %s: all %d slots of kind %d are in use or in flight: %w", job.key, pool.size(), k, tiers.ErrFull))
		return
	}
	s.st.usedSlots[k].Add(1)
	job.slot = slot
	s.inflight[job.key] = job
	s.inflightN++
	for {
		select {
		case s.ioJobs <- job:
			return
		case res := <-s.commits:
			s.handleCommits(res)
		}
	}
}

// indexNames reports whether the index maps key to this store's slot
// (an index error counts as no: the caller then rewrites the page).
func (s *Store) indexNames(key tiers.Key, slot int32) bool {
	recs, found := make([]indexes.Record, 1), make([]bool, 1)
	if err := s.index.Get(context.Background(), []indexes.Key{key.IndexKey()}, recs, found); err != nil {
		s.st.indexErrors.Add(1)
		return false
	}
	r := recs[0]
	return found[0] && int(r.Disk) == s.disk && r.Slot == uint64(slot) && r.Epoch == s.files[key.Kind].epoch()
}

func (s *Store) ackDurable(items []putItem) {
	acks := make([]tiers.Ack, len(items))
	for i, it := range items {
		acks[i] = tiers.Ack{Batch: it.batch, Index: it.index, Stage: tiers.AckDurable}
	}
	s.st.puts.Add(int64(len(items)))
	s.ack(acks...)
}

func (s *Store) record(k tiers.PayloadKind, slot int32, at uint64) indexes.Record {
	return indexes.Record{Disk: uint16(s.disk), Kind: uint8(k), Slot: uint64(slot), Epoch: s.files[k].epoch(), LastAccess: at}
}

func (s *Store) handleCommits(jobs []*writeJob) {
	for _, job := range jobs {
		k := job.key.Kind
		pool := s.pools[k]
		s.inflightN--
		delete(s.inflight, job.key)
		if job.err != nil {
			pool.abort(job.slot)
			s.st.usedSlots[k].Add(-1)
			s.failItems(job.items, job.err)
		} else {
			pool.commit(job.slot, s.clock.Add(1))
			s.st.livePages.Add(1)
			s.st.liveBytes.Add(s.pageBytes[k])
			s.st.spillBytes.Add(s.pageBytes[k])
			if job.dropped {
				// A reader found the fresh slot failing verification and
				// removed its index entry: the page is not stored.
				s.freeLive(k, job.slot)
				s.failItems(job.items, fmt.Errorf("l3disk put %s: slot %d failed verification right after its write: %w", job.key, job.slot, ErrPayloadCorrupt))
			} else {
				s.ackDurable(job.items)
			}
		}
		for _, d := range job.deletes {
			if job.err == nil && !job.dropped {
				if err := s.deleteLive([]tiers.Key{job.key}); err != nil {
					d.err = errors.Join(d.err, err)
				}
			}
			d.pending--
			if d.pending == 0 {
				d.done <- d.err
			}
		}
	}
}

// freeLive releases a live slot whose index entry is gone.
func (s *Store) freeLive(k tiers.PayloadKind, slot int32) {
	s.pools[k].release(slot)
	s.st.usedSlots[k].Add(-1)
	s.st.livePages.Add(-1)
	s.st.liveBytes.Add(-s.pageBytes[k])
}

// deleteLive removes live keys: index entry first (only if it still
// points at our slot), then the slot. Keys not live here are skipped.
func (s *Store) deleteLive(keys []tiers.Key) error {
	entries := make([]indexes.Entry, 0, len(keys))
	slots := make([]int32, 0, len(keys))
	seen := make(map[tiers.Key]bool, len(keys))
	for _, key := range keys {
		pool := s.pools[key.Kind]
		slot, ok := pool.lookup(key.Hash)
		if !ok || pool.state[slot] != slotLive || seen[key] {
			continue
		}
		seen[key] = true
		entries = append(entries, indexes.Entry{Key: key.IndexKey(), Record: s.record(key.Kind, slot, 0)})
		slots = append(slots, slot)
	}
	if len(entries) == 0 {
		return nil
	}
	deleted := make([]bool, len(entries))
	if err := s.index.DeleteIf(context.Background(), entries, deleted); err != nil {
		s.st.indexErrors.Add(1)
		return fmt.Errorf("l3disk delete %d keys: index: %w", len(entries), err)
	}
	for i, e := range entries {
		// NB: free even when the entry no longer pointed at our slot
		// (deleted[i] false): nothing references the slot any more.
		s.freeLive(tiers.PayloadKind(e.Key.Kind), slots[i])
	}
	return nil
}

// collect is the page-level LRU garbage collection of one kind: when
// occupancy reaches GCStart, reclaim coldest pages until GCStop, at most
// GCBatch per pass so the put behind it never waits long.
func (s *Store) collect(k tiers.PayloadKind) {
	pool := s.pools[k]
	occ := pool.occupancy()
	if occ >= s.cfg.GCStart {
		s.gcActive[k] = true
	}
	if !s.gcActive[k] {
		return
	}
	target := int(s.cfg.GCStop * float64(pool.size()))
	n := min(pool.used()-target, s.cfg.GCBatch)
	if n <= 0 {
		s.gcActive[k] = false
		return
	}
	entries := make([]indexes.Entry, 0, n)
	slots := make([]int32, 0, n)
	for slot := pool.head; slot != noSlot && len(slots) < n; slot = pool.next[slot] {
		entries = append(entries, indexes.Entry{
			Key:    indexes.Key{Hash: pool.hash[slot], Kind: uint8(k)},
			Record: s.record(k, slot, 0),
		})
		slots = append(slots, slot)
	}
	if len(slots) == 0 {
		return
	}
	deleted := make([]bool, len(entries))
	// NB: the index entry goes first, durably; only then is the slot
	// free for reuse, so a racing reader sees a miss or a header for
	// another page, never another page's bytes under this key.
	if err := s.index.DeleteIf(context.Background(), entries, deleted); err != nil {
		s.st.gcIndexErrors.Add(1)
		s.limiter.Error("gc-index", "l3 gc: index delete failed; nothing reclaimed", "kind", k, "pages", len(entries), "err", err)
		return
	}
	for _, slot := range slots {
		s.freeLive(k, slot)
	}
	s.st.evicted.Add(int64(len(slots)))
	if pool.used() <= target {
		s.gcActive[k] = false
	}
}

func (s *Store) postCtl(op ctlOp) {
	s.ctlMu.Lock()
	s.ctlQ = append(s.ctlQ, op)
	s.ctlMu.Unlock()
	signal(s.ctlSig)
}

func (s *Store) handleCtl() {
	s.ctlMu.Lock()
	ops := s.ctlQ
	s.ctlQ = nil
	s.ctlMu.Unlock()
	var touched []indexes.Key
	for _, op := range ops {
		switch op.kind {
		case ctlTouch:
			for _, key := range op.keys {
				pool := s.pools[key.Kind]
				if slot, ok := pool.lookup(key.Hash); ok && pool.state[slot] == slotLive {
					pool.touch(slot, s.clock.Add(1))
					touched = append(touched, key.IndexKey())
				}
			}
		case ctlDelete:
			var live []tiers.Key
			for _, key := range op.keys {
				if job, ok := s.inflight[key]; ok {
					job.deletes = append(job.deletes, op.del)
					op.del.pending++
					continue
				}
				live = append(live, key)
			}
			if err := s.deleteLive(live); err != nil {
				op.del.err = err
			}
			if op.del.pending == 0 {
				op.del.done <- op.del.err
			}
		case ctlCall:
			op.fn()
		case ctlCorrupt:
			pool := s.pools[op.key.Kind]
			slot, ok := pool.lookup(op.key.Hash)
			if !ok || uint64(slot) != op.rec.Slot || op.rec.Epoch != s.files[op.key.Kind].epoch() {
				continue
			}
			switch pool.state[slot] {
			case slotLive:
				s.freeLive(op.key.Kind, slot)
			case slotInFlight:
				s.inflight[op.key].dropped = true
			}
		}
	}
	if len(touched) > 0 {
		if err := s.index.Touch(context.Background(), touched, s.clock.Load()); err != nil {
			s.st.indexErrors.Add(1)
			s.limiter.Warn("touch-index", "l3 touch: index update failed (the in-memory LRU is updated)", "keys", len(touched), "err", err)
		}
	}
}

// ioLoop writes slots.
func (s *Store) ioLoop() {
	defer s.ioWG.Done()
	for job := range s.ioJobs {
		f := s.files[job.key.Kind]
		if err := f.writeSlot(int64(job.slot), job.buf.Bytes()); err != nil {
			s.st.writeErrors.Add(1)
			job.err = fmt.Errorf("l3disk put %s: %w", job.key, err)
			s.limiter.Error("write", "l3 slot write failed", "key", job.key.String(), "slot", job.slot, "path", f.path, "err", err)
		}
		s.releaseStaging(job)
		s.written <- job
	}
}

// maxSyncGroup bounds the writes made durable by one fdatasync and one
// index commit.
const maxSyncGroup = 1024

// syncLoop makes groups of written slots durable, then indexes them:
// data -> fdatasync -> index commit.
func (s *Store) syncLoop() {
	defer s.syncWG.Done()
	group := make([]*writeJob, 0, maxSyncGroup)
	for {
		job, ok := <-s.written
		if !ok {
			return
		}
		group = append(group[:0], job)
	drain:
		for len(group) < cap(group) {
			select {
			case j, ok := <-s.written:
				if !ok {
					break drain
				}
				group = append(group, j)
			default:
				break drain
			}
		}
		s.commitGroup(group)
		out := make([]*writeJob, len(group))
		copy(out, group)
		s.commits <- out
	}
}

func (s *Store) commitGroup(group []*writeJob) {
	synced := make([]bool, len(s.files))
	syncErr := make([]error, len(s.files))
	for _, j := range group {
		k := j.key.Kind
		if j.err != nil || synced[k] {
			continue
		}
		synced[k] = true
		f := s.files[k]
		if err := f.readOnlyErr(); err != nil {
			syncErr[k] = err
			continue
		}
		if err := f.sync(); err != nil {
			// NB: never retry: after EIO the kernel may have dropped
			// the dirty pages and cleared the error, so a second fsync
			// could "succeed" over lost data. The slab goes read-only.
			if f.markReadOnly(err) {
				s.log.Error("l3 fdatasync failed; slab is read-only for the rest of this run", "path", f.path, "err", err)
			}
			syncErr[k] = f.readOnlyErr()
		}
	}
	for k, done := range synced {
		if done && syncErr[k] == nil {
			s.st.syncs.Add(1)
		}
	}
	entries := make([]indexes.Entry, 0, len(group))
	at := s.clock.Load()
	for _, j := range group {
		if j.err != nil {
			continue
		}
		if err := syncErr[j.key.Kind]; err != nil {
			j.err = fmt.Errorf("l3disk put %s: %w: %w", j.key, tiers.ErrBroken, err)
			continue
		}
		entries = append(entries, indexes.Entry{Key: j.key.IndexKey(), Record: s.record(j.key.Kind, j.slot, at)})
	}
	s.st.syncedWrites.Add(int64(len(entries)))
	if len(entries) == 0 {
		return
	}
	if err := s.index.Put(context.Background(), entries); err != nil {
		s.st.indexErrors.Add(1)
		s.limiter.Error("put-index", "l3 index commit failed; pages not stored", "pages", len(entries), "err", err)
		for _, j := range group {
			if j.err == nil {
				j.err = fmt.Errorf("l3disk put %s: index: %w", j.key, err)
				if errors.Is(err, indexes.ErrFull) {
					j.err = fmt.Errorf("l3disk put %s: %w: %w", j.key, tiers.ErrFull, err)
				}
			}
		}
	}
}

// miss returns a per-item miss result.
func miss(key tiers.Key, why string, cause error) error {
	if cause != nil {
		return fmt.Errorf("l3disk get %s: %s: %w: %w", key, why, tiers.ErrMiss, cause)
	}
	return fmt.Errorf("l3disk get %s: %s: %w", key, why, tiers.ErrMiss)
}

// Get implements tiers.Store.
func (s *Store) Get(ctx context.Context, batch []tiers.GetRequest, results []error) error {
	if len(results) != len(batch) {
		return fmt.Errorf("l3disk get: %d results for %d requests: %w", len(results), len(batch), tiers.ErrInvalid)
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	dsts := make([][]byte, len(batch))
	keys := make([]indexes.Key, len(batch))
	for i, r := range batch {
		b, err := s.spanBytes(r.Key, r.Dst)
		if err != nil {
			return fmt.Errorf("l3disk get item %d: %w", i, err)
		}
		dsts[i], keys[i] = b, r.Key.IndexKey()
	}
	recs := make([]indexes.Record, len(batch))
	found := make([]bool, len(batch))
	if err := s.index.Get(ctx, keys, recs, found); err != nil {
		s.st.indexErrors.Add(1)
		return fmt.Errorf("l3disk get %d keys: index: %w: %w", len(keys), tiers.ErrBroken, err)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		drop []indexes.Entry
	)
	dropEntry := func(i int) {
		mu.Lock()
		drop = append(drop, indexes.Entry{Key: keys[i], Record: recs[i]})
		mu.Unlock()
	}
	for i, r := range batch {
		rec := recs[i]
		k := r.Key.Kind
		switch {
		case !found[i]:
			results[i] = miss(r.Key, "not found", nil)
			continue
		case rec.Kind != uint8(k) || int(rec.Disk) != s.disk || epochRank(rec.Epoch) != s.rank:
			// Another rank's or disk's page (a shared index): not ours
			// to read or to drop.
			results[i] = miss(r.Key, fmt.Sprintf("indexed on disk %d rank %d, this store is disk %d rank %d", rec.Disk, epochRank(rec.Epoch), s.disk, s.rank), nil)
			continue
		case rec.Epoch != s.files[k].epoch():
			results[i] = miss(r.Key, fmt.Sprintf("stale epoch %#x (current %#x)", rec.Epoch, s.files[k].epoch()), nil)
			s.st.staleDropped.Add(1)
			dropEntry(i)
			continue
		case rec.Slot >= uint64(s.files[k].sb.Slots):
			results[i] = miss(r.Key, fmt.Sprintf("slot %d out of range [0, %d)", rec.Slot, s.files[k].sb.Slots), ErrSlotMismatch)
			s.st.corrupt.Add(1)
			dropEntry(i)
			continue
		}
		var buf *diskfs.AlignedBuffer
		select {
		case buf = <-s.readBufs:
		case <-ctx.Done():
			results[i] = miss(r.Key, "cancelled", ctx.Err())
			continue
		}
		wg.Add(1)
		go func(i int, buf *diskfs.AlignedBuffer) {
			defer wg.Done()
			defer func() { s.readBufs <- buf }()
			f := s.files[k]
			s.readSem <- struct{}{}
			err := f.readSlot(int64(rec.Slot), buf.Bytes())
			<-s.readSem
			if err != nil {
				s.st.readErrors.Add(1)
				s.st.corrupt.Add(1)
				s.limiter.Error("read", "l3 slot read failed", "key", r.Key.String(), "slot", rec.Slot, "path", f.path, "err", err)
				results[i] = miss(r.Key, fmt.Sprintf("slot %d of %s unreadable", rec.Slot, f.path), err)
				dropEntry(i)
				return
			}
			p, err := verifySlot(buf.Bytes(), uint8(k), rec.Epoch, r.Key.Hash, s.pageBytes[k])
			if err != nil {
				s.st.corrupt.Add(1)
				results[i] = miss(r.Key, fmt.Sprintf("slot %d of %s failed verification", rec.Slot, f.path), err)
				dropEntry(i)
				return
			}
			copy(dsts[i], p)
			results[i] = nil
		}(i, buf)
	}
	wg.Wait()
	hits := int64(0)
	for i := range results {
		if results[i] == nil {
			hits++
			s.st.reloadBytes.Add(int64(len(dsts[i])))
		}
	}
	s.st.hits.Add(hits)
	s.st.misses.Add(int64(len(batch)) - hits)
	if len(drop) > 0 {
		// NB: DeleteIf, not Delete: the entry may have been replaced by a
		// newer put since we read it; only the stale one goes.
		deleted := make([]bool, len(drop))
		if err := s.index.DeleteIf(ctx, drop, deleted); err != nil {
			s.st.indexErrors.Add(1)
			s.limiter.Warn("get-drop", "l3 get: dropping bad entries from the index failed", "entries", len(drop), "err", err)
			return nil
		}
		for i, e := range drop {
			if deleted[i] {
				s.postCtl(ctlOp{kind: ctlCorrupt, key: tiers.Key{Hash: e.Key.Hash, Kind: tiers.PayloadKind(e.Key.Kind)}, rec: e.Record})
			}
		}
	}
	return nil
}

// LongestPrefix implements tiers.Store.
func (s *Store) LongestPrefix(ctx context.Context, kind tiers.PayloadKind, chain []pagehash.Hash) (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.leave()
	if _, err := s.kindBytes(kind); err != nil {
		return 0, fmt.Errorf("l3disk longest prefix: %w", err)
	}
	const step = 256
	n := 0
	keys := make([]indexes.Key, 0, min(step, len(chain)))
	recs := make([]indexes.Record, min(step, len(chain)))
	found := make([]bool, min(step, len(chain)))
	for len(chain) > 0 {
		part := chain[:min(step, len(chain))]
		chain = chain[len(part):]
		keys = keys[:0]
		for _, h := range part {
			keys = append(keys, indexes.Key{Hash: h, Kind: uint8(kind)})
		}
		if err := s.index.Get(ctx, keys, recs[:len(keys)], found[:len(keys)]); err != nil {
			return 0, fmt.Errorf("l3disk longest prefix: index: %w: %w", tiers.ErrBroken, err)
		}
		for i := range keys {
			r := recs[i]
			if !found[i] || int(r.Disk) != s.disk || r.Kind != uint8(kind) || r.Epoch != s.files[kind].epoch() {
				return n, nil
			}
			n++
		}
	}
	return n, nil
}

// Delete implements tiers.Store. Keys being written are deleted once
// their write lands, before Delete returns.
func (s *Store) Delete(ctx context.Context, keys []tiers.Key) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	for _, k := range keys {
		if _, err := s.kindBytes(k.Kind); err != nil {
			return fmt.Errorf("l3disk delete %s: %w", k, err)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	d := &deleteOp{done: make(chan error, 1)}
	s.postCtl(ctlOp{kind: ctlDelete, keys: append([]tiers.Key(nil), keys...), del: d})
	select {
	case err := <-d.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("l3disk delete: %w", ctx.Err())
	}
}

// Touch implements tiers.Store. It is asynchronous: the writer applies it
// before its next put.
func (s *Store) Touch(_ context.Context, keys []tiers.Key) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	for _, k := range keys {
		if _, err := s.kindBytes(k.Kind); err != nil {
			return fmt.Errorf("l3disk touch %s: %w", k, err)
		}
	}
	if len(keys) > 0 {
		s.postCtl(ctlOp{kind: ctlTouch, keys: append([]tiers.Key(nil), keys...)})
	}
	return nil
}

// Stats implements tiers.Store.
func (s *Store) Stats() tiers.StoreStats {
	var capacity int64
	for k, f := range s.files {
		capacity += f.sb.Slots * s.pageBytes[k]
	}
	return tiers.StoreStats{
		Pages: s.st.livePages.Load(), Bytes: s.st.liveBytes.Load(), CapacityBytes: capacity,
		Hits: s.st.hits.Load(), Misses: s.st.misses.Load(), Corrupt: s.st.corrupt.Load(),
		Puts: s.st.puts.Load(), PutFailures: s.st.putFailures.Load(), Evictions: s.st.evicted.Load(),
	}
}

// Close implements tiers.Store: queued puts fail with ErrClosed, puts
// already gathered are written and acknowledged, then files close.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return fmt.Errorf("l3disk close: %w", tiers.ErrClosed)
	}
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	s.bgCancel()
	s.bgWG.Wait()
	close(s.stop)
	s.gatherWG.Wait()
	s.writerWG.Wait()
	s.ioWG.Wait()
	close(s.written)
	s.syncWG.Wait()
	// The writer exits only with nothing in flight; commits is empty.
	return s.release()
}

// logInterval is how often one kind of fault is logged at most.
const logInterval = 10 * time.Second

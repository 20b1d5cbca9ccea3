package l3disk

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/internal/bgprio"
	"github.com/kvtier/kvtier/internal/ratelog"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
)

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
	log := env.Logger.With("tier", "l3disk", "disk", disk)
	if env.WorldSize > 1 {
		// A rank of a group names itself; a world of one has no rank
		// to tell (its host, kvtier serve, names its own).
		log = log.With("rank", env.Rank)
	}
	s := &Store{
		env: env, cfg: cfg, log: log,
		fs: fs, index: env.Index, slab: env.Slab, disk: disk, rank: env.Rank, coldStart: mode,
		rebuildMark: filepath.Join(dir, RebuildMarkName(stackID, env.Rank)),
		gatherSig:   make(chan struct{}, 1),
		ctlSig:      make(chan struct{}, 1),
		ackReady:    tiers.NewAckReady(),
		stop:        make(chan struct{}),
		inflight:    make(map[tiers.Key]*writeJob),
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
			Version: FormatVersion, Kind: uint8(k), Rank: uint32(env.Rank), PageBytes: spec.PageBytes,
			SlotBytes: SlotBytes(spec.PageBytes), Slots: slots,
			Epoch: epochFor(1, env.Rank), StackID: stackID,
		}
		path := filepath.Join(dir, SlabFileName(stackID, env.Rank, uint8(k)))
		kind := uint8(k)
		f, info, err := openSlabFile(fs, path, want, openMode{
			direct: cfg.ODirect, recreate: mode == tiers.ColdStartClear, create: true, depth: cfg.Depth,
			epochFloor: func() (uint64, error) { return s.indexEpochFloor(ctx, kind) },
		})
		if err != nil {
			return nil, fmt.Errorf("l3disk open: %w", err)
		}
		s.files = append(s.files, f)
		s.pageBytes = append(s.pageBytes, spec.PageBytes)
		refused = refused || info.directRefused
		switch {
		case info.recreated != nil:
			// NB: loud: every page the old file held is gone.
			s.log.Error("l3 slab file unusable; recreated empty, its pages are lost", "path", path, "kind", spec.Name,
				"reason", info.recreated.Error(), "new_epoch", f.epoch()>>16, "slots", slots)
		case info.created:
			s.log.Info("l3 slab file created", "path", path, "kind", spec.Name, "slots", slots, "slot_bytes", want.SlotBytes)
		case info.truncatedAt > 0:
			s.log.Error("l3 slab file was truncated; extended back, slots below the cut kept", "path", path, "kind", spec.Name,
				"truncated_at_bytes", info.truncatedAt, "slots_lost", info.lostSlots, "slots_kept", slots-info.lostSlots)
		}
		maxSlot = max(maxSlot, want.SlotBytes)
		s.pools = append(s.pools, newSlotPool(int(slots)))
		s.gcActive = append(s.gcActive, false)
		s.indexCap = append(s.indexCap, 0)
		s.verified = append(s.verified, make([]bool, slots))
	}
	s.direct = !refused && cfg.ODirect != ODirectOff
	switch cfg.ZeroCopy {
	case ZeroCopyOn:
		s.zeroCopy = true
	case ZeroCopyAuto:
		s.zeroCopy = env.Slab != nil && env.Slab.Geometry().PageSize >= hugeSlabPage
	}
	if refused {
		s.log.Warn("l3 o_direct refused by the file system; using buffered I/O with fdatasync", "dir", dir)
	}

	// Buffers: 2×depth staging (gather overlaps writes) and 2×depth read
	// buffers (verification and the copy out overlap the next Depth
	// reads in flight).
	s.staging = make(chan *diskfs.AlignedBuffer, 2*cfg.Depth)
	s.readBufs = make(chan *diskfs.AlignedBuffer, 2*cfg.Depth)
	s.reads = make(chan func())
	s.checks = make(chan func())
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
	// CPU up to Depth (bgprio.CPUs: the process's budget, not the raised
	// GOMAXPROCS), so a many-core host is not capped at one core's memcpy
	// rate, but one CPU is left to the callers: with a gatherer on every
	// P, a serve step's goroutines wait for a P behind pages being copied
	// (each gatherer also yields after every page).
	for range max(1, min(cfg.Depth, bgprio.CPUs()-1)) {
		s.gatherWG.Add(1)
		go s.gatherLoop()
	}
	go func() {
		s.gatherWG.Wait()
		close(s.gathered)
	}()
	for range max(1, bgprio.CPUs()-1) {
		s.checkWG.Add(1)
		go s.getLoop(s.checks)
	}
	for range cfg.Depth {
		s.checkWG.Add(1)
		go s.getLoop(s.reads)
	}
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

// indexEpochFloor returns the highest epoch among this store's index
// records of kind (its disk and rank), 0 if none.
func (s *Store) indexEpochFloor(ctx context.Context, kind uint8) (uint64, error) {
	var top uint64
	err := s.index.Iterate(ctx, func(e indexes.Entry) error {
		if e.Key.Kind == kind && int(e.Record.Disk) == s.disk && epochRank(e.Record.Epoch) == s.rank {
			top = max(top, e.Record.Epoch)
		}
		return nil
	})
	if err != nil && !errors.Is(err, indexes.ErrCorrupt) {
		// NB: corrupt records are reported after every good one was
		// seen; they name no epoch anyone can match.
		return 0, fmt.Errorf("highest epoch in the index: %w", err)
	}
	return top, nil
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

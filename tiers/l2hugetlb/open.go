package l2hugetlb

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/tiers"
)

// Timing of the lock protocol. A creator retries its exclusive lock for
// lockRetry (another rank may be probing it for a moment); a joining rank
// waits up to joinWait for the creator to finish.
const (
	lockRetry = 250 * time.Millisecond
	joinWait  = 60 * time.Second
	pollEvery = 20 * time.Millisecond
)

// slabFileRE matches slab file names: NAME-<i>.slab.
var slabFileRE = regexp.MustCompile(`^(.+)-([0-9]+)\.slab$`)

func slabPath(dir, name string, i int) string {
	return filepath.Join(dir, fmt.Sprintf("%s-%d.slab", name, i))
}

// stackTag turns a stack id into a file-name-safe tag: the id itself when it
// is safe, else "h" and the first 16 hex digits of its SHA-256.
func stackTag(stackID string) string {
	if nameRE.MatchString(stackID) {
		return stackID
	}
	sum := sha256.Sum256([]byte(stackID))
	return "h" + hex.EncodeToString(sum[:8])
}

func lockPath(dir, name, stackID string) string {
	return filepath.Join(dir, name+".stack-"+stackTag(stackID)+".lock")
}

// lockOwner returns the stack tag of a lock file path.
func lockOwner(path string) string {
	b := filepath.Base(path)
	_, tag, _ := strings.Cut(b, ".stack-")
	return strings.TrimSuffix(tag, ".lock")
}

// existingSlabs lists NAME-<i>.slab files in dir by index.
func existingSlabs(dir, name string) (map[int]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	out := map[int]string{}
	for _, e := range entries {
		m := slabFileRE.FindStringSubmatch(e.Name())
		if m == nil || m[1] != name {
			continue
		}
		i, err := strconv.Atoi(m[2])
		if err != nil {
			continue
		}
		out[i] = filepath.Join(dir, e.Name())
	}
	return out, nil
}

// otherLocks lists the lock files of name in dir other than own.
func otherLocks(dir, name, own string) ([]string, error) {
	locks, err := filepath.Glob(filepath.Join(dir, name+".stack-*.lock"))
	if err != nil {
		return nil, fmt.Errorf("list locks in %s: %w", dir, err)
	}
	return slices.DeleteFunc(locks, func(p string) bool { return p == own }), nil
}

// planSizes splits size bytes, rounded up to whole pages, into files of at
// most maxSlab bytes (rounded down to whole pages), as evenly as whole pages
// allow; earlier files get the extra pages.
func planSizes(size, maxSlab, pageSize int64) []int64 {
	pages := (size + pageSize - 1) / pageSize
	perFile := max(1, maxSlab/pageSize)
	n := (pages + perFile - 1) / perFile
	out := make([]int64, n)
	for i := range out {
		p := pages / n
		if int64(i) < pages%n {
			p++
		}
		out[i] = p * pageSize
	}
	return out
}

func sum(xs []int64) int64 {
	var s int64
	for _, x := range xs {
		s += x
	}
	return s
}

// Open creates the slab for a stack (rank 0) or joins the slab rank 0
// created (other ranks: they wait for it, then map the same files), and
// returns it mapped.
//
// The hugetlbfs mount is used when it is there and has room; otherwise,
// with fallback: shm, the slab goes to shm_dir with a warning; without the
// fallback Open fails with ErrNoHugetlbfs or ErrCapacity and an actionable
// message. Files left by a crashed host are handled as cfg.Stale says; files
// of a live process of another stack (or of this stack's previous
// incarnation) are refused with ErrLocked.
func Open(ctx context.Context, env tiers.Env, cfg Config) (*Slab, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("open l2 slab: %w", err)
	}
	if err := env.Validate(); err != nil {
		return nil, fmt.Errorf("open l2 slab: %w", err)
	}
	if env.StackID == "" {
		return nil, fmt.Errorf("open l2 slab: the tier env has no stack id (the slab lock needs one): %w", tiers.ErrInvalid)
	}
	logger := env.Logger.With("tier", "l2hugetlb", "rank", env.Rank)
	var s *Slab
	var err error
	if env.Rank != 0 {
		s, err = join(ctx, logger, cfg, env.StackID)
	} else {
		s, err = create(ctx, logger, cfg, env.StackID)
	}
	if err != nil {
		return nil, fmt.Errorf("open l2 slab (rank %d): %w", env.Rank, err)
	}
	if err := s.registerMetrics(env.Registerer, env.Rank); err != nil {
		return nil, errors.Join(fmt.Errorf("open l2 slab: %w", err), s.Close())
	}
	return s, nil
}

func (s *Slab) registerMetrics(r prometheus.Registerer, rank int) error {
	if r == nil {
		return nil
	}
	// The rank label keeps ranks that share a registry (several ranks in one
	// process, as in tests) from colliding.
	labels := prometheus.Labels{"backing": s.geom.Backing, "stack": s.geom.StackID, "rank": strconv.Itoa(rank)}
	bytes := prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvtier_l2_slab_bytes", Help: "Bytes of the mapped L2 slab files.", ConstLabels: labels})
	files := prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvtier_l2_slab_files", Help: "Number of mapped L2 slab files.", ConstLabels: labels})
	var total int64
	for _, f := range s.geom.Slabs {
		total += f.Size
	}
	bytes.Set(float64(total))
	files.Set(float64(len(s.geom.Slabs)))
	for _, c := range []prometheus.Collector{bytes, files} {
		if err := r.Register(c); err != nil {
			for _, done := range s.metrics {
				r.Unregister(done)
			}
			s.metrics = nil
			return fmt.Errorf("register l2 slab metrics: %w", err)
		}
		s.metrics = append(s.metrics, c)
	}
	s.reg = r
	return nil
}

// create is rank 0's path: pick the backing, lock, handle stale files,
// check capacity, create and map.
func create(ctx context.Context, logger *slog.Logger, cfg Config, stackID string) (*Slab, error) {
	info, herr := probeHugetlbfs(cfg.Mount)
	if herr == nil {
		s, err := createIn(ctx, logger, cfg, stackID, cfg.Mount, info)
		if err == nil || cfg.Fallback != FallbackShm || !errors.Is(err, ErrCapacity) {
			return s, err
		}
		logger.Warn("l2 slab: hugetlbfs mount is full, using the shm fallback; the slab is NOT hugepage-backed", "mount", cfg.Mount, "err", err, "shm_dir", cfg.ShmDir)
	} else {
		if cfg.Fallback != FallbackShm {
			return nil, fmt.Errorf("%v; mount one (mount -t hugetlbfs -o pagesize=2M none %s) or set fallback: shm: %w", herr, cfg.Mount, ErrNoHugetlbfs)
		}
		logger.Warn("l2 slab: no hugetlbfs mount, using the shm fallback; the slab is NOT hugepage-backed", "mount", cfg.Mount, "err", herr, "shm_dir", cfg.ShmDir)
	}
	sinfo, err := probeShm(cfg.ShmDir)
	if err != nil {
		return nil, fmt.Errorf("shm fallback: %w", err)
	}
	return createIn(ctx, logger, cfg, stackID, cfg.ShmDir, sinfo)
}

// flockRetry takes how on f, retrying a refused non-blocking attempt until
// wait has passed or ctx is done.
func flockRetry(ctx context.Context, f *os.File, how int, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollEvery):
		}
	}
}

func createIn(ctx context.Context, logger *slog.Logger, cfg Config, stackID, dir string, info backingInfo) (_ *Slab, err error) {
	sizes := planSizes(int64(cfg.Size), int64(cfg.MaxSlab), info.pageSize)
	own := lockPath(dir, cfg.Name, stackID)

	// Locks of other stacks on the same file names: a live one refuses, a
	// dead one makes the files stale. Their flocks are held until we are
	// done so no other creator races us.
	others, err := otherLocks(dir, cfg.Name, own)
	if err != nil {
		return nil, err
	}
	var held []*os.File
	defer func() {
		for _, f := range held {
			f.Close()
		}
	}()
	for _, p := range others {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open lock %s: %w", p, err)
		}
		held = append(held, f)
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("slab files %s belong to live stack %q (its lock %s is held); give this stack another name: %w",
					slabPath(dir, cfg.Name, 0), lockOwner(p), p, ErrLocked)
			}
			return nil, fmt.Errorf("lock %s: %w", p, err)
		}
	}

	createdLock := false
	lock, err := os.OpenFile(own, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		createdLock = true
	} else if errors.Is(err, os.ErrExist) {
		lock, err = os.OpenFile(own, os.O_RDWR, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("open slab lock: %w", err)
	}
	var created []string
	defer func() {
		if err == nil {
			return
		}
		for _, p := range created {
			_ = os.Remove(p)
		}
		if left, _ := existingSlabs(dir, cfg.Name); createdLock || len(left) == 0 {
			_ = os.Remove(own)
		}
		lock.Close()
	}()
	if err := flockRetry(ctx, lock, unix.LOCK_EX, lockRetry); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("slab lock %s is held by a live process of stack %q (a previous host or an attached plugin still running): %w", own, stackID, ErrLocked)
		}
		return nil, fmt.Errorf("lock %s: %w", own, err)
	}

	existing, err := existingSlabs(dir, cfg.Name)
	if err != nil {
		return nil, err
	}
	keep := map[int]bool{}
	if len(existing) > 0 || len(others) > 0 || !createdLock {
		what := fmt.Sprintf("%d slab files %s and locks %v", len(existing), filepath.Join(dir, cfg.Name+"-*.slab"), append(others, own))
		switch cfg.Stale {
		case StaleFail:
			return nil, fmt.Errorf("found stale %s left by a host that is gone (no live process holds them); set stale: remove or stale: reuse, or delete them: %w", what, ErrStale)
		case StaleRemove:
			logger.Warn("l2 slab: removing stale slab files left by a host that is gone", "files", what)
		case StaleReuse:
			for i, p := range existing {
				if i < len(sizes) {
					if st, err := os.Stat(p); err == nil && st.Size() == sizes[i] {
						keep[i] = true
					}
				}
			}
			logger.Warn("l2 slab: reusing stale slab files left by a host that is gone", "files", what, "reused", len(keep))
		}
		for i, p := range existing {
			if !keep[i] {
				if err := os.Remove(p); err != nil {
					return nil, fmt.Errorf("remove stale slab file: %w", err)
				}
			}
		}
		for _, p := range others {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("remove stale lock: %w", err)
			}
		}
	}

	var need int64
	for i, sz := range sizes {
		if !keep[i] {
			need += sz
		}
	}
	if info.kind == BackingHugetlbfs {
		// Re-probe: removing stale files may have freed pages.
		if info, err = probeHugetlbfs(dir); err != nil {
			return nil, err
		}
	} else if info, err = probeShm(dir); err != nil {
		return nil, err
	}
	if err := checkCapacity(dir, info, need); err != nil {
		return nil, err
	}

	s := &Slab{
		geom:    tiers.SlabGeometry{PageSize: info.pageSize, Backing: info.kind, StackID: stackID},
		lock:    lock,
		creator: true,
		logger:  logger,
	}
	defer func() {
		if err != nil {
			for _, m := range s.maps {
				_ = unix.Munmap(m)
			}
		}
	}()
	for i, sz := range sizes {
		p := slabPath(dir, cfg.Name, i)
		var f *os.File
		if keep[i] {
			f, err = os.OpenFile(p, os.O_RDWR, 0)
		} else {
			f, err = os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
			if err == nil {
				created = append(created, p)
			} else if errors.Is(err, os.ErrExist) {
				err = fmt.Errorf("%w (another stack created it meanwhile)", ErrLocked)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("create slab %d: %w", i, err)
		}
		m, err := setupFile(f, sz, info, cfg)
		f.Close() // the mapping keeps the memory; the descriptor is not needed
		if err != nil {
			return nil, fmt.Errorf("slab %d: %w", i, err)
		}
		s.maps = append(s.maps, m)
		s.geom.Slabs = append(s.geom.Slabs, tiers.SlabFile{ID: tiers.SlabID(i), Path: p, Size: sz})
	}
	// Creation is done: downgrade to shared so other ranks and plugins can
	// attach (they take the lock shared too).
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_SH); err != nil {
		return nil, fmt.Errorf("downgrade slab lock: %w", err)
	}
	logger.Info("l2 slab created", "backing", info.kind, "dir", dir, "files", len(sizes), "bytes", sum(sizes), "page_size", info.pageSize, "populate", cfg.Populate, "mlock", cfg.Mlock)
	return s, nil
}

// setupFile sizes, reserves and maps one slab file.
func setupFile(f *os.File, size int64, info backingInfo, cfg Config) ([]byte, error) {
	if err := f.Truncate(size); err != nil {
		return nil, fmt.Errorf("truncate %s to %d bytes: %w", f.Name(), size, err)
	}
	if info.kind == BackingShm {
		// Allocate the tmpfs pages now: a later write fault on a full tmpfs
		// would be a SIGBUS, not an error.
		if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
			return nil, fmt.Errorf("fallocate %s (%s): %w: %w", f.Name(), quantity.Size(size), err, ErrCapacity)
		}
	}
	m, err := mapFile(f, size, cfg.Populate)
	if err != nil {
		if errors.Is(err, unix.ENOMEM) {
			return nil, fmt.Errorf("%w: the hugepage pool cannot back %s; reserve more (echo N > /proc/sys/vm/nr_hugepages) or reduce size: %w", err, quantity.Size(size), ErrCapacity)
		}
		return nil, err
	}
	if cfg.Mlock {
		if err := unix.Mlock(m); err != nil {
			_ = unix.Munmap(m)
			return nil, fmt.Errorf("mlock %s (%s): %w; raise the memlock limit (ulimit -l) or set mlock: false", f.Name(), quantity.Size(size), err)
		}
	}
	return m, nil
}

// join is the path of ranks other than 0: wait until rank 0's slab is
// created, then map it.
func join(ctx context.Context, logger *slog.Logger, cfg Config, stackID string) (*Slab, error) {
	type candidate struct {
		dir  string
		info backingInfo
	}
	var cands []candidate
	if info, err := probeHugetlbfs(cfg.Mount); err == nil {
		cands = append(cands, candidate{cfg.Mount, info})
	}
	if cfg.Fallback == FallbackShm {
		if info, err := probeShm(cfg.ShmDir); err == nil {
			cands = append(cands, candidate{cfg.ShmDir, info})
		}
	}
	if len(cands) == 0 {
		return nil, fmt.Errorf("no hugetlbfs at %s and no shm fallback to join: %w", cfg.Mount, ErrNoHugetlbfs)
	}
	deadline := time.Now().Add(joinWait)
	for {
		for _, c := range cands {
			lock, state, err := joinLock(lockPath(c.dir, cfg.Name, stackID))
			if err != nil {
				return nil, err
			}
			if state != lockJoined {
				continue
			}
			g, err := joinGeometry(cfg, stackID, c.dir, c.info)
			if err != nil {
				lock.Close()
				return nil, err
			}
			s, err := attachFiles(logger, g, lock)
			if err != nil {
				return nil, err
			}
			logger.Info("l2 slab joined", "backing", g.Backing, "dir", c.dir, "files", len(g.Slabs))
			return s, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("rank 0 of stack %q did not create the slab within %v (looked for %s): %w", stackID, joinWait, lockPath(cands[0].dir, cfg.Name, stackID), ErrStale)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for rank 0's slab: %w", ctx.Err())
		case <-time.After(pollEvery):
		}
	}
}

// lockState is what joinLock found.
type lockState int

const (
	lockAbsent   lockState = iota // no lock file
	lockDead                      // nobody holds it: the creator is gone or not there yet
	lockCreating                  // held exclusively: the creator is creating
	lockJoined                    // share-locked by us; the creator is alive and done
)

// joinLock opens and share-locks a stack lock whose creator is alive and
// done: someone holds it (the creator), and nobody holds it exclusively
// (the creator finished creating). The file is returned only for
// lockJoined.
func joinLock(path string) (*os.File, lockState, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, lockAbsent, nil
	}
	if err != nil {
		return nil, lockAbsent, fmt.Errorf("open slab lock: %w", err)
	}
	// Probe on a second open file description: if we can lock it
	// exclusively nobody holds it, so its creator is gone (stale) or not
	// there yet.
	probe, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		f.Close()
		return nil, lockAbsent, fmt.Errorf("open slab lock: %w", err)
	}
	free := unix.Flock(int(probe.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil
	probe.Close()
	if free {
		f.Close()
		return nil, lockDead, nil
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, lockCreating, nil
		}
		return nil, lockAbsent, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, lockJoined, nil
}

// joinGeometry finds the slab files rank 0 created and checks they match
// this rank's config.
func joinGeometry(cfg Config, stackID, dir string, info backingInfo) (tiers.SlabGeometry, error) {
	sizes := planSizes(int64(cfg.Size), int64(cfg.MaxSlab), info.pageSize)
	g := tiers.SlabGeometry{PageSize: info.pageSize, Backing: info.kind, StackID: stackID}
	for i, want := range sizes {
		p := slabPath(dir, cfg.Name, i)
		st, err := os.Stat(p)
		if err != nil {
			return g, fmt.Errorf("slab %d of rank 0: %w", i, err)
		}
		if st.Size() != want {
			return g, fmt.Errorf("slab file %s is %d bytes but this rank's config (%s) says %d: ranks disagree on the slab config: %w", p, st.Size(), cfg, want, tiers.ErrInvalid)
		}
		g.Slabs = append(g.Slabs, tiers.SlabFile{ID: tiers.SlabID(i), Path: p, Size: want})
	}
	return g, nil
}

// Attach maps existing slab files by path for a second process (another
// rank, a plugin). It refuses files whose lock names another stack and
// files whose creator is gone, checks every file's size and backing against
// g, and holds the stack's lock shared until Close. Close only unmaps.
func Attach(ctx context.Context, logger *slog.Logger, g tiers.SlabGeometry) (tiers.Slab, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := checkGeometry(g); err != nil {
		return nil, fmt.Errorf("attach l2 slab: %w", err)
	}
	dir := filepath.Dir(g.Slabs[0].Path)
	name := slabFileRE.FindStringSubmatch(filepath.Base(g.Slabs[0].Path))[1]
	own := lockPath(dir, name, g.StackID)
	deadline := time.Now().Add(lockRetry)
	var lock *os.File
	for lock == nil {
		f, state, err := joinLock(own)
		switch {
		case err != nil:
			return nil, fmt.Errorf("attach l2 slab: %w", err)
		case state == lockJoined:
			lock = f
			continue
		case state == lockAbsent:
			others, _ := otherLocks(dir, name, own)
			if len(others) > 0 {
				return nil, fmt.Errorf("attach l2 slab %s: its lock names stack %q, not %q: %w", g.Slabs[0].Path, lockOwner(others[0]), g.StackID, ErrLocked)
			}
			return nil, fmt.Errorf("attach l2 slab %s: no lock of stack %q (%s); the creating host is gone: %w", g.Slabs[0].Path, g.StackID, own, ErrStale)
		case time.Now().After(deadline):
			if state == lockDead {
				return nil, fmt.Errorf("attach l2 slab %s: no live process of stack %q holds its lock %s; the creating host is gone: %w", g.Slabs[0].Path, g.StackID, own, ErrStale)
			}
			return nil, fmt.Errorf("attach l2 slab %s: the creator of stack %q is still creating it after %v: %w", g.Slabs[0].Path, g.StackID, lockRetry, ErrLocked)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("attach l2 slab: %w", ctx.Err())
		case <-time.After(pollEvery):
		}
	}
	s, err := attachFiles(logger, g, lock)
	if err != nil {
		return nil, fmt.Errorf("attach l2 slab: %w", err)
	}
	logger.Debug("l2 slab attached", "backing", g.Backing, "files", len(g.Slabs))
	return s, nil
}

func checkGeometry(g tiers.SlabGeometry) error {
	if len(g.Slabs) == 0 {
		return fmt.Errorf("geometry lists no slab files: %w", tiers.ErrInvalid)
	}
	if g.StackID == "" {
		return fmt.Errorf("geometry has no stack id: %w", tiers.ErrInvalid)
	}
	if g.Backing != BackingHugetlbfs && g.Backing != BackingShm {
		return fmt.Errorf("backing %q: want %s or %s: %w", g.Backing, BackingHugetlbfs, BackingShm, tiers.ErrInvalid)
	}
	if g.PageSize <= 0 {
		return fmt.Errorf("page size %d: %w", g.PageSize, tiers.ErrInvalid)
	}
	dir := filepath.Dir(g.Slabs[0].Path)
	var name string
	for i, f := range g.Slabs {
		m := slabFileRE.FindStringSubmatch(filepath.Base(f.Path))
		switch {
		case int(f.ID) != i:
			return fmt.Errorf("slab file %d has id %d: %w", i, f.ID, tiers.ErrInvalid)
		case m == nil || m[2] != strconv.Itoa(i) || filepath.Dir(f.Path) != dir || (i > 0 && m[1] != name):
			return fmt.Errorf("slab file %d path %q is not NAME-%d.slab beside the others: %w", i, f.Path, i, tiers.ErrInvalid)
		case f.Size <= 0 || f.Size%g.PageSize != 0:
			return fmt.Errorf("slab file %d size %d is not a positive multiple of the page size %d: %w", i, f.Size, g.PageSize, tiers.ErrInvalid)
		}
		name = m[1]
	}
	return nil
}

// attachFiles maps g's files, checking sizes and backing. It takes
// ownership of lock (closed on error).
func attachFiles(logger *slog.Logger, g tiers.SlabGeometry, lock *os.File) (_ *Slab, err error) {
	s := &Slab{geom: cloneGeometry(g), lock: lock, logger: logger}
	defer func() {
		if err != nil {
			for _, m := range s.maps {
				_ = unix.Munmap(m)
			}
			lock.Close()
		}
	}()
	for _, sf := range g.Slabs {
		f, err := os.OpenFile(sf.Path, os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("slab %d: %w", sf.ID, err)
		}
		m, err := attachFile(f, sf, g)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("slab %d: %w", sf.ID, err)
		}
		s.maps = append(s.maps, m)
	}
	return s, nil
}

func attachFile(f *os.File, sf tiers.SlabFile, g tiers.SlabGeometry) ([]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() != sf.Size {
		return nil, fmt.Errorf("%s is %d bytes, geometry says %d: %w", sf.Path, st.Size(), sf.Size, tiers.ErrInvalid)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &fs); err != nil {
		return nil, fmt.Errorf("statfs %s: %w", sf.Path, err)
	}
	if isHuge := fs.Type == unix.HUGETLBFS_MAGIC; isHuge != (g.Backing == BackingHugetlbfs) {
		return nil, fmt.Errorf("%s: filesystem type %#x does not match backing %s: %w", sf.Path, fs.Type, g.Backing, tiers.ErrInvalid)
	}
	return mapFile(f, sf.Size, false)
}

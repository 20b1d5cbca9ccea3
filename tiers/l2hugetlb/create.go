// Rank 0's path: pick the backing (hugetlbfs, else the shm fallback),
// take the lock, handle stale files and other stacks' locks, check
// capacity, create, size and map the files.

package l2hugetlb

import (
	"github.com/kvtier/kvtier/quantity"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/tiers"
)

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

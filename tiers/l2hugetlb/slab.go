// Package l2hugetlb is kvtier's L2 slab provider (Slab v1): it creates
// page-aligned slab files on a hugetlbfs mount (2 MiB pages), or on a tmpfs
// when the shm fallback is configured, and maps them shared, so every
// process of the node — the ranks of a stack, plugin processes — maps the
// same memory by path and page bytes never cross a pipe.
//
// The provider checks capacity before it creates anything (statfs of the
// mount: block size = hugepage size, free blocks = free hugepages), splits
// the slab into files of at most max_slab (one CUDA host registration per
// file; no transfer may straddle two), guards the files with a lock so two
// stacks cannot open the same files by mistake, and finds and handles
// slab files left by a crashed host.
//
// It never decides placement: what lives where inside the slab is the
// host's deterministic allocator's decision (host/placement). It never
// falls back to shm silently: only an explicit fallback: shm does, with a
// warning.
package l2hugetlb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/tiers"
)

// Backing names, as in tiers.SlabGeometry.Backing.
const (
	// BackingHugetlbfs: files on a hugetlbfs mount, 2 MiB pages.
	BackingHugetlbfs = "hugetlbfs"
	// BackingShm: files on a tmpfs (the explicit fallback), system pages.
	BackingShm = "shm"
)

// Sentinel errors callers branch on with errors.Is.
var (
	// ErrNoHugetlbfs: the mount is missing or not hugetlbfs, and the
	// fallback is off.
	ErrNoHugetlbfs = errors.New("no hugetlbfs mount")
	// ErrCapacity: the backing has too few free pages for the slab.
	ErrCapacity = errors.New("insufficient slab capacity")
	// ErrLocked: the slab files belong to a live process of another stack,
	// or of this stack's previous incarnation.
	ErrLocked = errors.New("slab files in use")
	// ErrStale: slab files from a host that is gone were found and the
	// config says stale: fail.
	ErrStale = errors.New("stale slab files")
)

// Slab is a set of mapped slab files. It implements tiers.Slab.
type Slab struct {
	geom    tiers.SlabGeometry
	maps    [][]byte
	lock    *os.File // the stack lock, held shared while mapped
	creator bool
	logger  *slog.Logger
	metrics []prometheus.Collector
	reg     prometheus.Registerer

	mu     sync.RWMutex
	closed bool
}

var _ tiers.Slab = (*Slab)(nil)

// Geometry returns the slab files, page size, backing and stack, for Attach
// in another process.
func (s *Slab) Geometry() tiers.SlabGeometry { return cloneGeometry(s.geom) }

func cloneGeometry(g tiers.SlabGeometry) tiers.SlabGeometry {
	g.Slabs = append([]tiers.SlabFile(nil), g.Slabs...)
	return g
}

// Bytes returns a view of span sp, aliasing the shared mapping. The view is
// valid until Close.
func (s *Slab) Bytes(sp tiers.Span) ([]byte, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, fmt.Errorf("slab span %+v: %w", sp, tiers.ErrClosed)
	}
	if int(sp.Slab) >= len(s.maps) {
		return nil, fmt.Errorf("slab span %+v: slab %d of %d: %w", sp, sp.Slab, len(s.maps), tiers.ErrInvalid)
	}
	m := s.maps[sp.Slab]
	if sp.Offset < 0 || sp.Length < 0 || sp.Offset > int64(len(m)) || sp.Length > int64(len(m))-sp.Offset {
		return nil, fmt.Errorf("slab span %+v: outside slab %d of %d bytes: %w", sp, sp.Slab, len(m), tiers.ErrInvalid)
	}
	return m[sp.Offset : sp.Offset+sp.Length : sp.Offset+sp.Length], nil
}

// Close unmaps the slab files. The creator also removes the files and its
// lock; an attached process only unmaps. Processes still attached keep
// their mappings (the memory is freed when the last one unmaps). A second
// Close returns ErrClosed.
func (s *Slab) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("close slab: %w", tiers.ErrClosed)
	}
	s.closed = true
	var errs []error
	for i, m := range s.maps {
		if err := unix.Munmap(m); err != nil {
			errs = append(errs, fmt.Errorf("unmap slab %d: %w", i, err))
		}
	}
	s.maps = nil
	if s.creator {
		for _, f := range s.geom.Slabs {
			if err := os.Remove(f.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove slab file: %w", err))
			}
		}
		if s.lock != nil {
			if err := os.Remove(s.lock.Name()); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove slab lock: %w", err))
			}
		}
	}
	if s.lock != nil {
		// Closing the descriptor drops the flock.
		if err := s.lock.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close slab lock: %w", err))
		}
	}
	for _, c := range s.metrics {
		s.reg.Unregister(c)
	}
	s.logger.Debug("l2 slab closed", "creator", s.creator, "files", len(s.geom.Slabs))
	return errors.Join(errs...)
}

// mapFile maps a slab file shared and read-write.
func mapFile(f *os.File, size int64, populate bool) ([]byte, error) {
	flags := unix.MAP_SHARED
	if populate {
		flags |= unix.MAP_POPULATE
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		return nil, fmt.Errorf("mmap %s (%d bytes): %w", f.Name(), size, err)
	}
	return m, nil
}

// Attacher maps existing slabs by path; it is the tiers.SlabAttacher of
// this package, for hosts that find attachers by type assertion.
type Attacher struct {
	// Logger receives the attach logs; nil discards them.
	Logger *slog.Logger
}

var _ tiers.SlabAttacher = Attacher{}

// Attach calls the package's Attach with a's logger.
func (a Attacher) Attach(ctx context.Context, g tiers.SlabGeometry) (tiers.Slab, error) {
	return Attach(ctx, a.Logger, g)
}

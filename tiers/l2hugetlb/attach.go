// Attach: a second process (a plugin, another rank) maps slab files by
// the geometry the creator published, checking every file against it.

package l2hugetlb

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/tiers"
)

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

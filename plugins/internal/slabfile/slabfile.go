// Package slabfile maps the files of a Slab v1 geometry into this process,
// shared and read-write, so that a plugin process reads and writes page bytes
// in the host's slab instead of receiving them over gRPC.
//
// It is the plugin side's stand-in for tiers/l2hugetlb.Attach until that
// lands; it also creates shm-backed slab files for the plugin tests and the
// plugin benchmark, which need a slab a second process can map. It never
// allocates inside a slab: placement is the host's decision.
package slabfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/tiers"
)

// Slab is a set of mapped slab files.
type Slab struct {
	geom    tiers.SlabGeometry
	maps    [][]byte
	created bool // remove the files at Close

	mu     sync.Mutex
	closed bool
}

var _ tiers.Slab = (*Slab)(nil)

// Attach maps every file of g. It checks that each file exists with the
// size g says and that ids are 0..n-1 in order.
func Attach(g tiers.SlabGeometry) (*Slab, error) {
	if len(g.Slabs) == 0 {
		return nil, fmt.Errorf("attach slab: geometry lists no slab files: %w", tiers.ErrInvalid)
	}
	s := &Slab{geom: cloneGeometry(g)}
	for i, f := range g.Slabs {
		if int(f.ID) != i {
			s.unmap()
			return nil, fmt.Errorf("attach slab: file %d has id %d, want %d: %w", i, f.ID, i, tiers.ErrInvalid)
		}
		m, err := mapFile(f)
		if err != nil {
			s.unmap()
			return nil, fmt.Errorf("attach slab %d: %w", f.ID, err)
		}
		s.maps = append(s.maps, m)
	}
	return s, nil
}

// Create makes one file per size in dir (a tmpfs such as /dev/shm, so the
// memory is shared page cache), maps them, and returns the slab. Close
// removes the files. Sizes are rounded up to pageSize.
func Create(dir, stackID string, pageSize int64, sizes ...int64) (*Slab, error) {
	if pageSize <= 0 {
		pageSize = int64(os.Getpagesize())
	}
	g := tiers.SlabGeometry{PageSize: pageSize, Backing: "shm", StackID: stackID}
	var paths []string
	cleanup := func() {
		for _, p := range paths {
			_ = os.Remove(p)
		}
	}
	for i, size := range sizes {
		size = (size + pageSize - 1) / pageSize * pageSize
		f, err := os.CreateTemp(dir, fmt.Sprintf("kvtier-slab-%d-*", i))
		if err != nil {
			cleanup()
			return nil, fmt.Errorf("create slab %d in %s: %w", i, dir, err)
		}
		paths = append(paths, f.Name())
		err = f.Truncate(size)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			cleanup()
			return nil, fmt.Errorf("size slab file %s to %d bytes: %w", f.Name(), size, err)
		}
		abs, err := filepath.Abs(f.Name())
		if err != nil {
			cleanup()
			return nil, fmt.Errorf("slab file %s: %w", f.Name(), err)
		}
		g.Slabs = append(g.Slabs, tiers.SlabFile{ID: tiers.SlabID(i), Path: abs, Size: size})
	}
	s, err := Attach(g)
	if err != nil {
		cleanup()
		return nil, err
	}
	s.created = true
	return s, nil
}

func mapFile(f tiers.SlabFile) ([]byte, error) {
	if f.Path == "" {
		return nil, fmt.Errorf("slab file has no path (not attachable): %w", tiers.ErrInvalid)
	}
	if f.Size <= 0 {
		return nil, fmt.Errorf("slab file %s: size %d: %w", f.Path, f.Size, tiers.ErrInvalid)
	}
	fd, err := os.OpenFile(f.Path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open slab file: %w", err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat slab file %s: %w", f.Path, err)
	}
	if st.Size() != f.Size {
		return nil, fmt.Errorf("slab file %s is %d bytes, geometry says %d: %w", f.Path, st.Size(), f.Size, tiers.ErrInvalid)
	}
	m, err := unix.Mmap(int(fd.Fd()), 0, int(f.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap slab file %s (%d bytes): %w", f.Path, f.Size, err)
	}
	return m, nil
}

// Geometry returns the geometry the slab was attached with.
func (s *Slab) Geometry() tiers.SlabGeometry { return cloneGeometry(s.geom) }

// Bytes returns the mapped view of span sp.
func (s *Slab) Bytes(sp tiers.Span) ([]byte, error) {
	if int(sp.Slab) >= len(s.maps) {
		return nil, fmt.Errorf("span %+v: slab %d of %d: %w", sp, sp.Slab, len(s.maps), tiers.ErrInvalid)
	}
	m := s.maps[sp.Slab]
	if sp.Offset < 0 || sp.Length < 0 || sp.Offset > int64(len(m))-sp.Length {
		return nil, fmt.Errorf("span %+v: outside slab of %d bytes: %w", sp, len(m), tiers.ErrInvalid)
	}
	return m[sp.Offset : sp.Offset+sp.Length : sp.Offset+sp.Length], nil
}

// Close unmaps the files, and removes them if Create made them.
func (s *Slab) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.unmap()
	if s.created {
		for _, f := range s.geom.Slabs {
			if rerr := os.Remove(f.Path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
				err = errors.Join(err, fmt.Errorf("remove slab file: %w", rerr))
			}
		}
	}
	return err
}

func (s *Slab) unmap() error {
	var err error
	for i, m := range s.maps {
		if uerr := unix.Munmap(m); uerr != nil {
			err = errors.Join(err, fmt.Errorf("munmap slab %d: %w", i, uerr))
		}
	}
	s.maps = nil
	return err
}

func cloneGeometry(g tiers.SlabGeometry) tiers.SlabGeometry {
	g.Slabs = append([]tiers.SlabFile(nil), g.Slabs...)
	return g
}

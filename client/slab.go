package client

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	pb "github.com/kvtier/kvtier/api/enginev1"
)

// Slab is serve's L2 slab mapped into the engine: copy plans name spans of
// its files.
type Slab struct {
	maps [][]byte
}

// MapSlab maps every file of g shared, read and write.
func MapSlab(g *pb.SlabGeometry) (*Slab, error) {
	s := &Slab{}
	for i, f := range g.GetFiles() {
		if int(f.GetId()) != i {
			s.Close()
			return nil, fmt.Errorf("kvtier client: slab file %d has id %d", i, f.GetId())
		}
		if f.GetSize() == 0 || f.GetSize() > 1<<46 {
			s.Close()
			return nil, fmt.Errorf("kvtier client: slab file %s: size %d", f.GetPath(), f.GetSize())
		}
		fd, err := os.OpenFile(f.GetPath(), os.O_RDWR, 0)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("kvtier client: map slab: %w", err)
		}
		b, err := unix.Mmap(int(fd.Fd()), 0, int(f.GetSize()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		fd.Close()
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("kvtier client: map slab %s: %w", f.GetPath(), err)
		}
		// NB: page tables filled now (hugetlbfs: microseconds a GiB), not
		// by a fault in the engine's first copies; advice only, so a
		// kernel without MADV_POPULATE_WRITE (before 5.14) maps as before.
		_ = unix.Madvise(b, unix.MADV_POPULATE_WRITE)
		s.maps = append(s.maps, b)
	}
	return s, nil
}

// Bytes returns the span's bytes; out of range is an error naming it.
func (s *Slab) Bytes(slab uint32, off, length uint64) ([]byte, error) {
	if int(slab) >= len(s.maps) {
		return nil, fmt.Errorf("kvtier client: slab %d of %d", slab, len(s.maps))
	}
	m := s.maps[slab]
	if off > uint64(len(m)) || length > uint64(len(m))-off {
		return nil, fmt.Errorf("kvtier client: span [%d, +%d) outside slab %d of %d bytes", off, length, slab, len(m))
	}
	return m[off : off+length], nil
}

// Close unmaps the slab.
func (s *Slab) Close() error {
	var errs []error
	for _, b := range s.maps {
		errs = append(errs, unix.Munmap(b))
	}
	s.maps = nil
	return errors.Join(errs...)
}

package tiertest

import (
	"fmt"

	"github.com/kvtier/kvtier/tiers"
)

// HeapSlab is a Slab v1 over ordinary process memory: one slab, no file, so
// no other process can attach to it. It exists for tests of in-process
// stores; production slabs come from tiers/l2hugetlb.
type HeapSlab struct {
	mem []byte
}

// NewHeapSlab returns a heap-backed slab of size bytes.
func NewHeapSlab(size int64) *HeapSlab { return &HeapSlab{mem: make([]byte, size)} }

// Geometry describes the single anonymous slab (no path: not attachable).
func (s *HeapSlab) Geometry() tiers.SlabGeometry {
	return tiers.SlabGeometry{
		Slabs:    []tiers.SlabFile{{ID: 0, Size: int64(len(s.mem))}},
		PageSize: 4096,
		Backing:  "heap",
	}
}

// Bytes returns the view of span sp.
func (s *HeapSlab) Bytes(sp tiers.Span) ([]byte, error) {
	if sp.Slab != 0 || sp.Offset < 0 || sp.Length < 0 || sp.Offset+sp.Length > int64(len(s.mem)) {
		return nil, fmt.Errorf("heap slab span %+v (slab size %d): %w", sp, len(s.mem), tiers.ErrInvalid)
	}
	return s.mem[sp.Offset : sp.Offset+sp.Length : sp.Offset+sp.Length], nil
}

// Close releases nothing; the memory is garbage collected.
func (s *HeapSlab) Close() error { return nil }

package tiers

import (
	"context"

	"github.com/kvtier/kvtier/registry"
)

// SlabV1 is the role ID of the shared host-memory hub.
const SlabV1 registry.TypeID = "kvtier.tier.slab.v1"

// SlabID numbers the slab files of one Slab, from 0.
type SlabID uint32

// Span is a byte range inside one slab file. It never straddles two slabs:
// a transfer that would is split by the host's allocator before it is made.
type Span struct {
	// Slab is the slab file the span lies in.
	Slab SlabID
	// Offset is the byte offset within that slab.
	Offset int64
	// Length is the number of bytes.
	Length int64
}

// SlabFile describes one mapped slab file.
type SlabFile struct {
	// ID is the slab's number; Span.Slab refers to it.
	ID SlabID
	// Path is the file any process of the node maps to share the memory.
	Path string
	// Size is the file's length in bytes, a multiple of PageSize.
	Size int64
}

// SlabGeometry is everything a second process needs to attach to a Slab.
type SlabGeometry struct {
	// Slabs lists the slab files in ID order.
	Slabs []SlabFile
	// PageSize is the backing page size (2 MiB for hugetlbfs, the system
	// page size for the shm fallback). Slab sizes are multiples of it.
	PageSize int64
	// Backing names the backing store: "hugetlbfs" or "shm".
	Backing string
	// StackID identifies the stack that created the slabs; Attach refuses
	// files whose lock names another stack.
	StackID string
}

// Slab v1 is the shared host memory hub (L2): one or more page-aligned
// regions, each a file that any process of the node can map.
//
// The provider creates, maps, checks capacity and reports. It does not
// allocate: placement inside the slab is the host's deterministic allocator's
// decision (host/placement), so every rank computes the same offsets.
//
// Ownership: the memory belongs to the Slab until Close. Byte views returned
// by Bytes alias the mapping and are valid until Close; writers and readers
// of the same span are coordinated by the host (a span is written by one
// party at a time, as the host's placement state says).
type Slab interface {
	// Geometry returns the slab files and page size, for Attach elsewhere.
	Geometry() SlabGeometry
	// Bytes returns a view of span s. It fails with ErrInvalid if s is out
	// of range or names an unknown slab.
	Bytes(s Span) ([]byte, error)
	// Close unmaps the slabs. The creator also removes the files and its
	// lock; an attached process only unmaps.
	Close() error
}

// SlabAttacher maps an existing slab by path (another rank, a plugin
// process). It is an optional ability of a Slab implementation's package.
type SlabAttacher interface {
	Attach(ctx context.Context, g SlabGeometry) (Slab, error)
}

package placement

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
)

// digestMagic starts the canonical encoding; a change of the encoding is a
// new magic.
const digestMagic = "kvtier.placement.v1\n"

func encodeLayout(b []byte, l Layout) []byte {
	b = append(b, digestMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(l.Kinds)))
	for _, k := range l.Kinds {
		b = binary.LittleEndian.AppendUint64(b, uint64(k.PageBytes))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(k.Regions)))
		for _, r := range k.Regions {
			b = binary.LittleEndian.AppendUint32(b, uint32(r.Slab))
			b = binary.LittleEndian.AppendUint64(b, uint64(r.Offset))
			b = binary.LittleEndian.AppendUint64(b, uint64(r.Pages))
		}
	}
	return b
}

// Digest returns the SHA-256 of the allocator's canonical state (see
// AppendState). It depends only on that state, not on the operations that
// led to it, so two replicas that applied the same operations agree, and a
// replica that missed or changed one operation (almost surely) does not.
func (a *Allocator) Digest() [sha256.Size]byte {
	b := a.AppendState(a.buf[:0])
	a.buf = b[:0]
	return sha256.Sum256(b)
}

// AppendState appends the canonical encoding of the state to b and returns
// it: the layout, every kind's free ranges in address order, and every
// object in id order with its pages, kinds, committed bit and ranges, in
// little-endian fixed-width fields. Digest hashes exactly these bytes; a
// host that finds digests differ can dump them to show the divergence.
func (a *Allocator) AppendState(b []byte) []byte {
	b = append(b, a.layoutSum...)
	for _, f := range a.free {
		b = binary.LittleEndian.AppendUint64(b, uint64(f.count))
		f.walk(func(start, pages int64) bool {
			b = binary.LittleEndian.AppendUint64(b, uint64(start))
			b = binary.LittleEndian.AppendUint64(b, uint64(pages))
			return true
		})
	}
	ids := a.scratch[:0]
	for id := range a.objects {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(ids)))
	for _, id := range ids {
		o := a.objects[id]
		b = binary.LittleEndian.AppendUint64(b, uint64(o.id))
		b = binary.LittleEndian.AppendUint64(b, uint64(o.pages))
		b = binary.LittleEndian.AppendUint64(b, uint64(o.kinds))
		if o.committed {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(o.rangeList())))
		for _, r := range o.rangeList() {
			b = append(b, r.Kind)
			b = binary.LittleEndian.AppendUint64(b, uint64(r.Start))
			b = binary.LittleEndian.AppendUint64(b, uint64(r.Pages))
		}
	}
	a.scratch = ids[:0]
	return b
}

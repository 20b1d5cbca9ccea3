package l3disk

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
)

// geometryProbe bounds how far into a file with an unreadable superblock
// salvage looks for a slot header to learn the slot size from.
const geometryProbe = 64 << 20

// salvageSuperblock rewrites the unreadable superblock of the slab file
// at path (kvtier inspect l3 --repair) from what its slot headers say: the
// page size from the first header of the file's kind and rank (at a slot
// boundary for that size), the slot count from the file's length, the
// epoch from the highest header epoch. It refuses when the index has seen
// a newer epoch of this file than any header (salvaging would move the
// epoch backwards; the store's next open recreates the file above it).
// want carries the kind, rank and stack id the file name gives.
func salvageSuperblock(ctx context.Context, opts CheckOptions, path string, want superblock, disk int) (*slabFile, string, error) {
	f, err := opts.FS.OpenFile(path, diskfs.OpenOptions{})
	if err != nil {
		return nil, "", err
	}
	sf := &slabFile{fs: opts.FS, f: f, path: path}
	fail := func(err error) (*slabFile, string, error) { return nil, "", errors.Join(err, f.Close()) }
	if err := f.Lock(); err != nil {
		if errors.Is(err, diskfs.ErrLocked) {
			return fail(fmt.Errorf("slab %s: in use: %w", path, ErrInUse))
		}
		return fail(err)
	}
	size, err := f.Size()
	if err != nil {
		return fail(err)
	}
	buf, err := diskfs.NewAlignedBuffer(diskfs.BlockSize)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = buf.Free() }()
	for off := int64(superblockSize); off+diskfs.BlockSize <= min(size, superblockSize+geometryProbe) && want.PageBytes == 0; off += diskfs.BlockSize {
		if _, err := f.ReadAt(buf.Bytes(), off); err != nil {
			continue
		}
		h, err := DecodeSlotHeader(buf.Bytes())
		if err != nil || h.Kind != want.Kind || epochRank(h.Epoch) != int(want.Rank) || h.PayloadLen == 0 {
			continue
		}
		if (off-superblockSize)%SlotBytes(int64(h.PayloadLen)) == 0 {
			want.PageBytes = int64(h.PayloadLen)
			want.Version = h.Version
		}
	}
	if want.PageBytes == 0 {
		return fail(fmt.Errorf("no slot header of kind %d rank %d in its first %d MiB to learn the slot size from", want.Kind, want.Rank, geometryProbe>>20))
	}
	want.SlotBytes = SlotBytes(want.PageBytes)
	want.Slots = (size - superblockSize) / want.SlotBytes
	want.Epoch = sf.headerEpochFloor(want, size)
	var top uint64
	err = opts.Index.Iterate(ctx, func(e indexes.Entry) error {
		if int(e.Record.Disk) == disk && epochRank(e.Record.Epoch) == int(want.Rank) && e.Key.Kind == want.Kind {
			top = max(top, e.Record.Epoch)
		}
		return nil
	})
	if err != nil && !errors.Is(err, indexes.ErrCorrupt) {
		return fail(fmt.Errorf("highest epoch in the index: %w", err))
	}
	if top > want.Epoch {
		return fail(fmt.Errorf("the index has seen epoch %d, newer than every slot header (%d): salvaging would move the epoch backwards", top>>16, want.Epoch>>16))
	}
	if err := sf.writeSuperblock(want); err != nil {
		return fail(err)
	}
	return sf, fmt.Sprintf("superblock rewritten from the slot headers: page bytes %d, %d slots, epoch %d", want.PageBytes, want.Slots, want.Epoch>>16), nil
}

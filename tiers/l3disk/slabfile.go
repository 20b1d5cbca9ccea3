package l3disk

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"

	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
)

// ErrInUse means a slab file is held by another process (or another store
// in this one): two hosts must never write the same slots.
var ErrInUse = errors.New("l3 slab file in use by another process")

// ErrReadOnly marks puts refused because a slab turned read-only after a
// failed fdatasync: after EIO the kernel may have dropped the dirty data
// and cleared the error, so a retried fsync could report success for data
// that never reached the disk. The slab is never written again in this run.
var ErrReadOnly = errors.New("l3 slab read-only after a failed fdatasync")

var stackIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// SlabFileName returns the slab file name of (stack, rank, kind) in a disk
// directory. Every rank has its own files, so ranks may share a disk.
func SlabFileName(stackID string, rank int, kind uint8) string {
	return fmt.Sprintf("kvtier-l3-%s-r%d-k%d.slab", stackID, rank, kind)
}

// RebuildMarkName is the file a rebuild of the index entries of (stack,
// rank) creates before its first index write and removes once they are all
// durable. While it exists the index is incomplete: the next cold start
// "load" rebuilds again instead of trusting it (and freeing the slots it
// does not name).
func RebuildMarkName(stackID string, rank int) string {
	return fmt.Sprintf("kvtier-l3-%s-r%d.rebuilding", stackID, rank)
}

// slabGlob matches every slab file name in a directory.
const slabGlob = "kvtier-l3-*-r*-k*.slab"

// epochFor composes a file epoch from a generation and the rank: the rank
// in the low 16 bits makes a record self-identifying when several ranks'
// files share one disk and one index (a record of rank r's file can never
// carry rank s's epoch).
func epochFor(generation uint64, rank int) uint64 { return generation<<16 | uint64(rank)&0xffff }

// epochRank returns the rank bits of an epoch.
func epochRank(epoch uint64) int { return int(epoch & 0xffff) }

// slabFile is one preallocated file of fixed-size slots for one payload
// kind on one disk: a 4 KiB superblock, then slot i at superblockSize +
// i*slotBytes.
type slabFile struct {
	fs    diskfs.FS
	f     diskfs.File
	path  string
	sb    superblock
	roErr atomic.Pointer[error]
}

func (s *slabFile) offset(slot int64) int64 { return superblockSize + slot*s.sb.SlotBytes }
func (s *slabFile) fileSize() int64         { return s.offset(s.sb.Slots) }
func (s *slabFile) epoch() uint64           { return s.sb.Epoch }

// readOnlyErr returns the error that made the slab read-only, or nil.
func (s *slabFile) readOnlyErr() error {
	if p := s.roErr.Load(); p != nil {
		return *p
	}
	return nil
}

// markReadOnly records the first fatal write-path error. It reports
// whether this call was the one that did it (to log once).
func (s *slabFile) markReadOnly(cause error) bool {
	err := fmt.Errorf("slab %s: %w: %w", s.path, ErrReadOnly, cause)
	return s.roErr.CompareAndSwap(nil, &err)
}

// openMode says what openSlabFile may do with an existing file.
type openMode struct {
	// direct is the O_DIRECT mode: auto, on or off.
	direct string
	// recreate allows replacing a file made for another geometry
	// (cold start clear).
	recreate bool
	// create allows creating a missing or unreadable file and extending
	// a truncated one; false for offline inspection.
	create bool
	// depth is the number of preallocation writes in flight.
	depth int
	// anyGeometry accepts an existing file of any geometry (offline
	// inspection reads what is there).
	anyGeometry bool
	// extend allows extending a truncated file back to its geometry
	// (kvtier inspect l3 --repair) where create is false.
	extend bool
	// epochFloor, if set, returns the highest epoch the index holds for
	// this file (disk, rank, kind); a file recreated from an unreadable
	// superblock starts above it and above every slot header's epoch.
	epochFloor func() (uint64, error)
}

// openInfo says what openSlabFile did besides opening.
type openInfo struct {
	// created: the file was (re)created and preallocated.
	created bool
	// directRefused: auto mode fell back to buffered I/O.
	directRefused bool
	// recreated is why an existing file was replaced (nil if it was not):
	// every page in it is lost.
	recreated error
	// truncatedAt is the length a truncated file had before it was
	// extended back to its geometry (0 if it was not truncated): the
	// slots wholly below it keep their pages.
	truncatedAt int64
	// lostSlots is the number of slots at or beyond truncatedAt.
	lostSlots int64
}

// ErrTruncated marks a slab file shorter than its superblock says.
var ErrTruncated = errors.New("slab file truncated")

// openSlabFile opens (creating and preallocating if needed) the slab file
// at path for the geometry in want, locked against any other opener.
func openSlabFile(fs diskfs.FS, path string, want superblock, m openMode) (sf *slabFile, info openInfo, err error) {
	f, err := fs.OpenFile(path, diskfs.OpenOptions{Create: m.create, Direct: m.direct != ODirectOff})
	if errors.Is(err, diskfs.ErrDirectRefused) && m.direct == ODirectAuto {
		info.directRefused = true
		f, err = fs.OpenFile(path, diskfs.OpenOptions{Create: m.create})
	}
	if err != nil {
		if errors.Is(err, diskfs.ErrDirectRefused) {
			return nil, info, fmt.Errorf("slab %s: o_direct is on but the file system refuses it (use o_direct: auto or off): %w", path, err)
		}
		return nil, info, fmt.Errorf("slab %s: %w", path, err)
	}
	sf = &slabFile{fs: fs, f: f, path: path}
	fail := func(err error) (*slabFile, openInfo, error) {
		return nil, openInfo{}, errors.Join(err, f.Close())
	}
	if err := f.Lock(); err != nil {
		if errors.Is(err, diskfs.ErrLocked) {
			return fail(fmt.Errorf("slab %s: another process (or store) has it open; a slab file serves one host at a time: %w", path, ErrInUse))
		}
		return fail(fmt.Errorf("slab %s: %w", path, err))
	}
	size, err := f.Size()
	if err != nil {
		return fail(err)
	}
	got, rerr := sf.readSuperblock()
	if rerr != nil && size < superblockSize {
		if size == 0 {
			rerr = fmt.Errorf("empty file: %w", ErrBadSuperblock)
		} else {
			rerr = fmt.Errorf("truncated to %d bytes, shorter than its %d-byte superblock: %w: %w", size, superblockSize, ErrTruncated, ErrBadSuperblock)
		}
	}
	switch {
	case rerr == nil && (m.anyGeometry || sameGeometry(got, want)):
		sf.sb = got
		if size >= sf.fileSize() {
			return sf, info, nil
		}
		whole := max(0, (size-superblockSize)/got.SlotBytes)
		info.truncatedAt, info.lostSlots = size, got.Slots-whole
		if !m.create && !m.extend {
			if m.anyGeometry {
				// NB: inspection reads the intact head; the lost
				// slots read as unreadable.
				return sf, info, nil
			}
			return fail(fmt.Errorf("slab %s: truncated: %d bytes, superblock says %d (slots %d..%d are gone): %w",
				path, size, sf.fileSize(), whole, got.Slots-1, ErrTruncated))
		}
		// NB: a truncation (by hand, or a file system repair) keeps the
		// slots wholly below the cut: extend the file back with zeros
		// from the first damaged slot on and keep the epoch, so the
		// cold start finds the survivors.
		if err := sf.fillZeros(sf.offset(whole), sf.fileSize(), m.depth); err != nil {
			return fail(err)
		}
		if err := f.Datasync(); err != nil {
			return fail(fmt.Errorf("slab %s: sync extended file: %w", path, err))
		}
		return sf, info, nil
	case rerr == nil && !m.recreate:
		return fail(fmt.Errorf("slab %s was made for kind %d, rank %d, stack %q, page bytes %d, %d slots; the config wants kind %d, rank %d, stack %q, page bytes %d, %d slots: start with cold_start: clear to recreate it",
			path, got.Kind, got.Rank, got.StackID, got.PageBytes, got.Slots, want.Kind, want.Rank, want.StackID, want.PageBytes, want.Slots))
	case rerr != nil && !m.create:
		return fail(fmt.Errorf("slab %s: %w", path, rerr))
	}
	// New, unreadable or (with recreate) of another geometry: preallocate.
	sf.sb = want
	switch {
	case rerr == nil:
		info.recreated = fmt.Errorf("made for another geometry (kind %d, page bytes %d, %d slots, stack %q)", got.Kind, got.PageBytes, got.Slots, got.StackID)
		if got.Epoch >= want.Epoch {
			// NB: keep epochs increasing across a recreate so no record of
			// the old file can ever match the new one.
			sf.sb.Epoch = epochFor((got.Epoch>>16)+1, int(want.Rank))
		}
	case size > 0:
		info.recreated = rerr
		// NB: the superblock, and the epoch in it, is lost. Start above
		// every epoch still visible (slot headers, index records) so no
		// old record can match the new file: epochs never go backwards.
		floor := sf.headerEpochFloor(want, size)
		if m.epochFloor != nil {
			ix, err := m.epochFloor()
			if err != nil {
				return fail(fmt.Errorf("slab %s: superblock unreadable (%w) and the index cannot say which epochs it used: %w", path, rerr, err))
			}
			floor = max(floor, ix)
		}
		if floor >= want.Epoch {
			sf.sb.Epoch = epochFor((floor>>16)+1, int(want.Rank))
		}
	}
	if err := sf.preallocate(m.depth); err != nil {
		return fail(err)
	}
	if err := fs.SyncDir(filepath.Dir(path)); err != nil {
		return fail(err)
	}
	info.created = true
	return sf, info, nil
}

// headerEpochFloor returns the highest epoch of want's rank and kind in
// the slot headers of a file of size bytes laid out as want (0 if none).
func (s *slabFile) headerEpochFloor(want superblock, size int64) uint64 {
	buf, err := diskfs.NewAlignedBuffer(diskfs.BlockSize)
	if err != nil {
		return 0
	}
	defer func() { _ = buf.Free() }()
	var top uint64
	for slot := int64(0); slot < want.Slots; slot++ {
		off := superblockSize + slot*want.SlotBytes
		if off+diskfs.BlockSize > size {
			break
		}
		if _, err := s.f.ReadAt(buf.Bytes(), off); err != nil {
			continue
		}
		h, err := DecodeSlotHeader(buf.Bytes())
		if err != nil || h.Kind != want.Kind || epochRank(h.Epoch) != int(want.Rank) {
			continue
		}
		top = max(top, h.Epoch)
	}
	return top
}

func sameGeometry(a, b superblock) bool {
	return a.Kind == b.Kind && a.Rank == b.Rank && a.PageBytes == b.PageBytes &&
		a.SlotBytes == b.SlotBytes && a.Slots == b.Slots && a.StackID == b.StackID
}

func (s *slabFile) readSuperblock() (superblock, error) {
	buf, err := diskfs.NewAlignedBuffer(superblockSize)
	if err != nil {
		return superblock{}, err
	}
	defer func() { _ = buf.Free() }()
	if _, err := s.f.ReadAt(buf.Bytes(), 0); err != nil {
		return superblock{}, fmt.Errorf("read superblock: %w", err)
	}
	return decodeSuperblock(buf.Bytes())
}

// writeSuperblock writes sb as block 0 and syncs it.
func (s *slabFile) writeSuperblock(sb superblock) error {
	buf, err := diskfs.NewAlignedBuffer(superblockSize)
	if err != nil {
		return err
	}
	defer func() { _ = buf.Free() }()
	if err := sb.encode(buf.Bytes()); err != nil {
		return err
	}
	if _, err := s.f.WriteAt(buf.Bytes(), 0); err != nil {
		return fmt.Errorf("slab %s: write superblock: %w", s.path, err)
	}
	if err := s.f.Datasync(); err != nil {
		s.markReadOnly(err)
		return fmt.Errorf("slab %s: sync superblock: %w", s.path, err)
	}
	s.sb = sb
	return nil
}

// preallocate writes zeros over every slot (an fallocate'd extent that was
// never written is not made durable by fdatasync alone), syncs, then writes
// the superblock last so a crash mid-way leaves a file that is recreated.
func (s *slabFile) preallocate(depth int) error {
	if err := s.f.Truncate(0); err != nil {
		return err
	}
	if err := s.fillZeros(superblockSize, s.fileSize(), depth); err != nil {
		return err
	}
	if err := s.f.Datasync(); err != nil {
		return fmt.Errorf("slab %s: sync preallocated slots: %w", s.path, err)
	}
	return s.writeSuperblock(s.sb)
}

// fillZeros writes zeros over [from, end), depth writes in flight.
func (s *slabFile) fillZeros(from, end int64, depth int) error {
	const chunk = 8 << 20
	var (
		next = from
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs = make([]error, max(depth, 1))
	)
	for w := range max(depth, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf, err := diskfs.NewAlignedBuffer(chunk)
			if err != nil {
				errs[w] = err
				return
			}
			defer func() { _ = buf.Free() }()
			for {
				mu.Lock()
				off := next
				next += chunk
				mu.Unlock()
				if off >= end {
					return
				}
				n := min(int64(chunk), end-off)
				if _, err := s.f.WriteAt(buf.Bytes()[:n], off); err != nil {
					errs[w] = fmt.Errorf("slab %s: preallocate: %w", s.path, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// bumpEpoch starts a new generation: every slot and every index record
// of the old epoch becomes invisible (cold start clear, O(1)).
func (s *slabFile) bumpEpoch() error {
	sb := s.sb
	sb.Epoch = epochFor((sb.Epoch>>16)+1, int(sb.Rank))
	// Nothing of the old epoch is read again, so the file takes this
	// build's layout (a version 1 file becomes version 2).
	sb.Version = FormatVersion
	return s.writeSuperblock(sb)
}

// version returns the file's format version.
func (s *slabFile) version() uint16 {
	if s.sb.Version == 0 {
		return FormatVersion
	}
	return s.sb.Version
}

// payloadOff returns where a slot's payload starts.
func (s *slabFile) payloadOff() int64 { return PayloadOffset(s.version(), s.sb.PageBytes) }

// blockPayload reports whether the payload fills whole blocks from the
// slot's second block on: then it can move between the disk and the
// caller's memory without a staging copy (writeSlotv, readSlotv).
func (s *slabFile) blockPayload() bool { return s.payloadOff() == diskfs.BlockSize }

// writeSlotv writes a slot as its header block (hdr, one block) and its
// payload straight from p, in one transfer. Only for blockPayload files.
func (s *slabFile) writeSlotv(slot int64, hdr, p []byte) error {
	if _, err := s.f.WritevAt([][]byte{hdr[:diskfs.BlockSize], p}, s.offset(slot)); err != nil {
		return fmt.Errorf("slab %s slot %d: %w", s.path, slot, err)
	}
	return nil
}

// readSlotv reads a slot's header block into hdr and its payload straight
// into p, in one transfer. Only for blockPayload files.
func (s *slabFile) readSlotv(slot int64, hdr, p []byte) error {
	if _, err := s.f.ReadvAt([][]byte{hdr[:diskfs.BlockSize], p}, s.offset(slot)); err != nil {
		return fmt.Errorf("slab %s slot %d: %w", s.path, slot, err)
	}
	return nil
}

// writeSlot writes a whole slot (header, payload, pad) in one transfer.
func (s *slabFile) writeSlot(slot int64, buf []byte) error {
	if _, err := s.f.WriteAt(buf[:s.sb.SlotBytes], s.offset(slot)); err != nil {
		return fmt.Errorf("slab %s slot %d: %w", s.path, slot, err)
	}
	return nil
}

// readSlot reads a whole slot in one transfer.
func (s *slabFile) readSlot(slot int64, buf []byte) error {
	if _, err := s.f.ReadAt(buf[:s.sb.SlotBytes], s.offset(slot)); err != nil {
		return fmt.Errorf("slab %s slot %d: %w", s.path, slot, err)
	}
	return nil
}

// readHeaderBlock reads the first block of a slot (its header) into buf.
func (s *slabFile) readHeaderBlock(slot int64, buf []byte) error {
	if _, err := s.f.ReadAt(buf[:diskfs.BlockSize], s.offset(slot)); err != nil {
		return fmt.Errorf("slab %s slot %d header: %w", s.path, slot, err)
	}
	return nil
}

// sync makes written slots durable.
func (s *slabFile) sync() error { return s.f.Datasync() }

func (s *slabFile) close() error { return s.f.Close() }

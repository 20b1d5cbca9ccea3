package l3disk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sort"
	"sync"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
)

// CheckOptions configures an offline check of l3disk slab files against
// their index (kvtier inspect l3). No store may have the files open: the
// check takes each file's lock and fails with ErrInUse otherwise.
type CheckOptions struct {
	// Dirs are the disk directories in disk-number order (disk i of the
	// config is Dirs[i]; records name disks by that number).
	Dirs []string
	// StackID, if set, limits the check to that stack's slab files.
	StackID string
	// Index is the store's index, opened by the caller.
	Index indexes.Index
	// Repair deletes index entries that name no valid slot (dangling,
	// corrupt or of an older epoch). Slots need no repair: a slot no
	// entry names is free to the next cold start.
	Repair bool
	// Depth is the number of reads in flight (default 8).
	Depth int
	// FS is the file system (default the real one).
	FS diskfs.FS
	// Logger receives progress; nil discards.
	Logger *slog.Logger
}

// FileCheck is what the check found in one slab file.
type FileCheck struct {
	Path      string
	Disk      int
	Rank      int
	Kind      uint8
	StackID   string
	Epoch     uint64
	Slots     int64
	SlotBytes int64
	// Live slots hold a page their index entry names, verified in full
	// (header and payload CRC). Orphan slots hold a valid page of the
	// current epoch that no entry names. Corrupt slots are named by an
	// entry but fail verification. Free slots are everything else (never
	// written, older epoch, or unreadable garbage no entry names).
	Live, Orphan, Corrupt, Free int64
}

// CheckReport is the result of Check.
type CheckReport struct {
	Files []FileCheck
	// Totals over Files.
	Live, Orphan, Corrupt, Free int64
	// Dangling counts index entries of the current epoch that name no
	// valid slot (out of range, a slot holding another page or nothing);
	// Stale counts entries of an older epoch (left by a cold start clear
	// whose background sweep did not finish); Unchecked counts entries
	// naming a (disk, rank, kind) none of the scanned files hold.
	Dangling, Stale, Unchecked int64
	// Repaired counts index entries deleted by Repair.
	Repaired int64
}

// Damaged reports whether the check found damage: corrupt slots or
// dangling entries. Orphans and stale entries are the normal residue of
// a crash or a clear and are not damage.
func (r CheckReport) Damaged() bool { return r.Corrupt > 0 || r.Dangling > 0 }

type fileKey struct {
	disk, rank int
	kind       uint8
}

// Check scans every slab file in opts.Dirs (full reads: header and payload
// CRC of every written slot) and cross-checks them with the index.
func Check(ctx context.Context, opts CheckOptions) (CheckReport, error) {
	var rep CheckReport
	if opts.Index == nil {
		return rep, fmt.Errorf("l3 check: no index")
	}
	if opts.FS == nil {
		opts.FS = diskfs.OS{}
	}
	if opts.Depth <= 0 {
		opts.Depth = 8
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	type scanned struct {
		fc      *FileCheck
		f       *slabFile
		headers []SlotHeader
		valid   []bool // header of the current epoch with a good payload CRC
		written []bool // header of the current epoch (payload maybe bad)
		refd    []bool
	}
	files := map[fileKey]*scanned{}
	defer func() {
		for _, s := range files {
			_ = s.f.close()
		}
	}()
	for disk, dir := range opts.Dirs {
		paths, err := filepath.Glob(filepath.Join(dir, slabGlob))
		if err != nil {
			return rep, fmt.Errorf("l3 check: list %s: %w", dir, err)
		}
		sort.Strings(paths)
		for _, p := range paths {
			f, _, err := openSlabFile(opts.FS, p, superblock{}, openMode{direct: ODirectAuto, anyGeometry: true})
			if err != nil {
				return rep, fmt.Errorf("l3 check: %w", err)
			}
			if opts.StackID != "" && f.sb.StackID != opts.StackID {
				_ = f.close()
				continue
			}
			k := fileKey{disk, int(f.sb.Rank), f.sb.Kind}
			if other, dup := files[k]; dup {
				_ = f.close()
				return rep, fmt.Errorf("l3 check: %s and %s both hold disk %d rank %d kind %d (different stacks in one directory? pass --stack)", other.fc.Path, p, disk, k.rank, k.kind)
			}
			n := f.sb.Slots
			s := &scanned{
				fc: &FileCheck{Path: p, Disk: disk, Rank: int(f.sb.Rank), Kind: f.sb.Kind, StackID: f.sb.StackID,
					Epoch: f.sb.Epoch, Slots: n, SlotBytes: f.sb.SlotBytes},
				f: f, headers: make([]SlotHeader, n), valid: make([]bool, n), written: make([]bool, n), refd: make([]bool, n),
			}
			files[k] = s
			log.Info("l3 check: scanning", "path", p, "slots", n)
			if err := fullScan(ctx, f, opts.Depth, s.headers, s.valid, s.written); err != nil {
				return rep, fmt.Errorf("l3 check: %w", err)
			}
		}
	}
	var bad []indexes.Entry
	err := opts.Index.Iterate(ctx, func(e indexes.Entry) error {
		rec := e.Record
		s, ok := files[fileKey{int(rec.Disk), epochRank(rec.Epoch), e.Key.Kind}]
		if !ok {
			rep.Unchecked++
			return nil
		}
		switch {
		case rec.Epoch != s.f.epoch():
			rep.Stale++
			bad = append(bad, e)
		case rec.Kind != e.Key.Kind || rec.Slot >= uint64(s.fc.Slots) || !s.written[rec.Slot] ||
			s.headers[rec.Slot].Hash != e.Key.Hash || s.refd[rec.Slot]:
			rep.Dangling++
			bad = append(bad, e)
		case !s.valid[rec.Slot]:
			s.refd[rec.Slot] = true
			s.fc.Corrupt++
			bad = append(bad, e)
		default:
			s.refd[rec.Slot] = true
			s.fc.Live++
		}
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("l3 check: iterate index: %w", err)
	}
	keys := make([]fileKey, 0, len(files))
	for k := range files {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.disk != b.disk {
			return a.disk < b.disk
		}
		if a.rank != b.rank {
			return a.rank < b.rank
		}
		return a.kind < b.kind
	})
	for _, k := range keys {
		s := files[k]
		for i := range s.refd {
			if s.written[i] && s.valid[i] && !s.refd[i] {
				s.fc.Orphan++
			}
		}
		s.fc.Free = s.fc.Slots - s.fc.Live - s.fc.Orphan - s.fc.Corrupt
		rep.Files = append(rep.Files, *s.fc)
		rep.Live += s.fc.Live
		rep.Orphan += s.fc.Orphan
		rep.Corrupt += s.fc.Corrupt
		rep.Free += s.fc.Free
	}
	if opts.Repair && len(bad) > 0 {
		for len(bad) > 0 {
			part := bad[:min(len(bad), 1024)]
			bad = bad[len(part):]
			deleted := make([]bool, len(part))
			if err := opts.Index.DeleteIf(ctx, part, deleted); err != nil {
				return rep, fmt.Errorf("l3 check: repair: delete %d entries: %w", len(part), err)
			}
			for _, d := range deleted {
				if d {
					rep.Repaired++
				}
			}
		}
	}
	return rep, nil
}

// fullScan reads every slot of f whole and fills headers, written (a
// header of the current epoch) and valid (written and the payload CRC
// matches).
func fullScan(ctx context.Context, f *slabFile, depth int, headers []SlotHeader, valid, written []bool) error {
	var (
		next int64
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs = make([]error, depth)
	)
	for w := range depth {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf, err := diskfs.NewAlignedBuffer(int(f.sb.SlotBytes))
			if err != nil {
				errs[w] = err
				return
			}
			defer func() { _ = buf.Free() }()
			for {
				mu.Lock()
				slot := next
				next++
				mu.Unlock()
				if slot >= f.sb.Slots {
					return
				}
				if err := ctx.Err(); err != nil {
					errs[w] = err
					return
				}
				if err := f.readSlot(slot, buf.Bytes()); err != nil {
					continue // unreadable: neither written nor valid
				}
				h, err := DecodeSlotHeader(buf.Bytes())
				if err != nil || h.Kind != f.sb.Kind || h.Epoch != f.epoch() || int64(h.PayloadLen) != f.sb.PageBytes {
					continue
				}
				headers[slot], written[slot] = h, true
				_, err = verifySlot(buf.Bytes(), h.Kind, h.Epoch, h.Hash, f.sb.PageBytes)
				valid[slot] = err == nil
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

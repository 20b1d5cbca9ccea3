package l3disk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
)

// CheckOptions configures an offline check of l3disk slab files against
// their index (kvtier inspect l3). No store may have the files open: the
// check takes each file's lock and fails with ErrInUse otherwise. Without
// Repair or RebuildIndex it writes nothing.
type CheckOptions struct {
	// Dirs are the disk directories in disk-number order (disk i of the
	// config is Dirs[i]; records name disks by that number). Each must
	// exist.
	Dirs []string
	// StackID, if set, limits the check to that stack's slab files.
	StackID string
	// Index is the store's index, opened by the caller.
	Index indexes.Index
	// Repair deletes index entries that name no valid slot (dangling,
	// corrupt, of an older or a newer epoch, or naming a missing or
	// unusable slab file), extends truncated slab files back to their
	// geometry (their intact slots stay), rewrites an unreadable
	// superblock from the slot headers when that keeps epochs
	// increasing, and rebuilds the index from the
	// slot headers when the index is corrupt or names none of the pages
	// the slabs hold. Slots need no repair: a slot no entry names is free
	// to the next cold start.
	Repair bool
	// RebuildIndex replaces every entry of the scanned files with one per
	// verified slot, whatever the index held (implies Repair).
	RebuildIndex bool
	// Depth is the number of reads in flight (default 8).
	Depth int
	// FS is the file system (default the real one).
	FS diskfs.FS
	// Logger receives progress; nil discards.
	Logger *slog.Logger
}

// FileCheck is what the check found in one slab file.
type FileCheck struct {
	Path    string
	Disk    int
	Rank    int
	Kind    uint8
	StackID string
	Epoch   uint64
	// Format is the file's on-disk format version (FormatVersion).
	Format    uint16
	Slots     int64
	SlotBytes int64
	// Live slots hold a page their index entry names, verified in full
	// (header and payload CRC). Orphan slots hold a valid page of the
	// current epoch that no entry names. Corrupt slots are named by an
	// entry but fail verification. Lost slots lie past the end of a
	// truncated file or failed to read. Free slots are everything else
	// (never written, older epoch, or garbage no entry names).
	Live, Orphan, Corrupt, Lost, Free int64
	// Problem says why the file could not be used as it is (truncated, an
	// unreadable superblock, not a regular file); empty if it could.
	Problem string
	// Repaired says what Repair did to the file itself, if anything.
	Repaired string
}

// CheckReport is the result of Check.
type CheckReport struct {
	Files []FileCheck
	// Totals over Files.
	Live, Orphan, Corrupt, Lost, Free int64
	// Dangling counts index entries of the current epoch that name no
	// valid slot (out of range, a slot holding another page or nothing);
	// Stale counts entries of an older epoch (left by a cold start clear
	// whose background sweep did not finish); Newer counts entries of a
	// newer epoch than their file's (the file was rolled back); Missing
	// counts entries naming a slab file of a scanned disk that is absent
	// or unusable; Unchecked counts entries naming a disk not scanned.
	Dangling, Stale, Newer, Missing, Unchecked int64
	// IndexCorrupt is the index's own failure (corrupt records, damaged
	// files set aside at open), empty if none.
	IndexCorrupt string
	// AllOrphans: the slabs hold valid pages and the index names none of
	// them (a missing, replaced or wrong index).
	AllOrphans bool
	// Unfinished names the rebuild marks found (RebuildMarkName): an index
	// rebuild that stopped before its entries were all durable, so the
	// index lacks pages the slabs hold. Repair rebuilds and removes them.
	Unfinished []string
	// Repaired counts index entries deleted by Repair.
	Repaired int64
	// Rebuilt is what rebuilding the index from the slot headers did
	// (zero if it did not run).
	Rebuilt RebuildCounts
}

// Damaged reports whether the check found damage: corrupt or lost slots,
// entries that name no valid slot or a missing file, unusable files, an
// index that is corrupt or names none of the pages. Orphans and stale
// entries are the normal residue of a crash or a clear and are not damage.
func (r CheckReport) Damaged() bool {
	for _, f := range r.Files {
		if f.Problem != "" {
			return true
		}
	}
	return r.Corrupt > 0 || r.Lost > 0 || r.Dangling > 0 || r.Newer > 0 || r.Missing > 0 || r.IndexCorrupt != "" || r.AllOrphans || len(r.Unfinished) > 0
}

type fileKey struct {
	disk, rank int
	kind       uint8
}

// rebuildMarkPattern parses RebuildMarkName.
var rebuildMarkPattern = regexp.MustCompile(`^kvtier-l3-(.+)-r(\d+)\.rebuilding$`)

// slabNamePattern parses SlabFileName.
var slabNamePattern = regexp.MustCompile(`^kvtier-l3-(.+)-r(\d+)-k(\d+)\.slab$`)

// checkedFile is one slab file being checked.
type checkedFile struct {
	fc   *FileCheck
	f    *slabFile // nil when the file is unusable
	scan fileScan
	refd []bool
}

// Check scans every slab file in opts.Dirs (full reads: header and payload
// CRC of every written slot) and cross-checks them with the index.
func Check(ctx context.Context, opts CheckOptions) (CheckReport, error) {
	var rep CheckReport
	if opts.Index == nil {
		return rep, fmt.Errorf("l3 check: no index")
	}
	if len(opts.Dirs) == 0 {
		return rep, fmt.Errorf("l3 check: no disk directory given")
	}
	opts.Repair = opts.Repair || opts.RebuildIndex
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
	files := map[fileKey]*checkedFile{}
	unusable := map[fileKey]bool{} // files that exist but cannot be read as slabs
	var order []*checkedFile
	defer func() {
		for _, c := range order {
			if c.f != nil {
				_ = c.f.close()
			}
		}
	}()
	scanned := 0
	for disk, dir := range opts.Dirs {
		st, err := os.Stat(dir)
		if err != nil {
			return rep, fmt.Errorf("l3 check: disk %d directory: %w", disk, err)
		}
		if !st.IsDir() {
			return rep, fmt.Errorf("l3 check: disk %d: %s is not a directory", disk, dir)
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			return rep, fmt.Errorf("l3 check: list %s: %w", dir, err)
		}
		for _, e := range ents {
			if m := rebuildMarkPattern.FindStringSubmatch(e.Name()); m != nil && (opts.StackID == "" || m[1] == opts.StackID) {
				rep.Unfinished = append(rep.Unfinished, filepath.Join(dir, e.Name()))
				continue
			}
			m := slabNamePattern.FindStringSubmatch(e.Name())
			if m == nil {
				continue
			}
			if opts.StackID != "" && m[1] != opts.StackID {
				continue
			}
			rank, _ := strconv.Atoi(m[2])
			kind, _ := strconv.Atoi(m[3])
			p := filepath.Join(dir, e.Name())
			scanned++
			c, err := openChecked(ctx, opts, p, m[1], disk, rank, kind)
			if err != nil {
				return rep, err
			}
			order = append(order, c)
			if c.f == nil {
				unusable[fileKey{disk, rank, uint8(kind)}] = true
				log.Warn("l3 check: unusable slab file", "path", p, "problem", c.fc.Problem)
				continue
			}
			k := fileKey{disk, int(c.f.sb.Rank), c.f.sb.Kind}
			if other, dup := files[k]; dup {
				return rep, fmt.Errorf("l3 check: %s and %s both hold disk %d rank %d kind %d (different stacks in one directory? pass --stack)", other.fc.Path, p, disk, k.rank, k.kind)
			}
			files[k] = c
			log.Info("l3 check: scanning", "path", p, "slots", c.f.sb.Slots)
			if c.scan, err = verifyFile(ctx, c.f, opts.Depth); err != nil {
				return rep, fmt.Errorf("l3 check: %w", err)
			}
			c.refd = make([]bool, c.f.sb.Slots)
		}
	}
	if scanned == 0 {
		return rep, fmt.Errorf("l3 check: no slab files (%s) in %v%s", slabGlob, opts.Dirs, stackNote(opts.StackID))
	}
	if d, ok := opts.Index.(indexes.Recoverer); ok && d.OpenDamage() != nil {
		rep.IndexCorrupt = "set aside at open: " + d.OpenDamage().Error()
	}
	var bad []indexes.Entry
	err := opts.Index.Iterate(ctx, func(e indexes.Entry) error {
		rec := e.Record
		k := fileKey{int(rec.Disk), epochRank(rec.Epoch), e.Key.Kind}
		c, ok := files[k]
		if !ok {
			if int(rec.Disk) < len(opts.Dirs) && (opts.StackID == "" || unusable[k]) {
				rep.Missing++
				bad = append(bad, e)
			} else {
				rep.Unchecked++
			}
			return nil
		}
		sc := &c.scan
		switch {
		case rec.Epoch < c.f.epoch():
			rep.Stale++
			bad = append(bad, e)
		case rec.Epoch > c.f.epoch():
			rep.Newer++
			bad = append(bad, e)
		case rec.Kind != e.Key.Kind || rec.Slot >= uint64(c.fc.Slots) || c.refd[rec.Slot]:
			rep.Dangling++
			bad = append(bad, e)
		case sc.verdict[rec.Slot] == verdictUnreadable:
			c.refd[rec.Slot] = true
			rep.Dangling++
			bad = append(bad, e)
		case sc.verdict[rec.Slot] == verdictBadPayload && sc.headers[rec.Slot].Hash == e.Key.Hash:
			c.refd[rec.Slot] = true
			c.fc.Corrupt++
			bad = append(bad, e)
		case sc.verdict[rec.Slot] != verdictValid || sc.headers[rec.Slot].Hash != e.Key.Hash:
			rep.Dangling++
			bad = append(bad, e)
		default:
			c.refd[rec.Slot] = true
			c.fc.Live++
		}
		return nil
	})
	if err != nil {
		if !errors.Is(err, indexes.ErrCorrupt) {
			return rep, fmt.Errorf("l3 check: iterate index: %w", err)
		}
		rep.IndexCorrupt = err.Error()
	}
	sort.Slice(order, func(i, j int) bool { return order[i].fc.Path < order[j].fc.Path })
	for _, c := range order {
		if c.f != nil {
			for i, v := range c.scan.verdict {
				switch {
				case v == verdictValid && !c.refd[i]:
					c.fc.Orphan++
				case v == verdictUnreadable:
					c.fc.Lost++
				}
			}
			c.fc.Free = c.fc.Slots - c.fc.Live - c.fc.Orphan - c.fc.Corrupt - c.fc.Lost
		}
		rep.Live += c.fc.Live
		rep.Orphan += c.fc.Orphan
		rep.Corrupt += c.fc.Corrupt
		rep.Lost += c.fc.Lost
		rep.Free += c.fc.Free
	}
	rep.AllOrphans = rep.Live == 0 && rep.Orphan > 0
	if opts.Repair {
		if err := repair(ctx, opts, &rep, files, bad, log); err != nil {
			return rep, err
		}
	}
	for _, c := range order {
		rep.Files = append(rep.Files, *c.fc)
	}
	return rep, nil
}

func stackNote(id string) string {
	if id == "" {
		return ""
	}
	return fmt.Sprintf(" of stack %q", id)
}

// openChecked opens one slab file for the check. A file that cannot be
// used (not a regular file, unreadable superblock) is returned with its
// problem and no file; only a file in use by a store aborts the check.
func openChecked(ctx context.Context, opts CheckOptions, path, stackID string, disk, rank, kind int) (*checkedFile, error) {
	fc := &FileCheck{Path: path, Disk: disk, Rank: rank, Kind: uint8(kind), StackID: stackID}
	f, info, err := openSlabFile(opts.FS, path, superblock{}, openMode{direct: ODirectAuto, anyGeometry: true, extend: opts.Repair, depth: opts.Depth})
	switch {
	case errors.Is(err, ErrInUse):
		return nil, fmt.Errorf("l3 check: %w", err)
	case err != nil && opts.Repair && errors.Is(err, ErrBadHeader) && !errors.Is(err, diskfs.ErrNotRegular):
		fc.Problem = problemOf(err)
		sf, what, serr := salvageSuperblock(ctx, opts, path, superblock{Kind: uint8(kind), Rank: uint32(rank), StackID: stackID}, disk)
		if serr != nil {
			if errors.Is(serr, ErrInUse) {
				return nil, fmt.Errorf("l3 check: %w", serr)
			}
			fc.Problem += "; not salvaged: " + serr.Error()
			return &checkedFile{fc: fc}, nil
		}
		fc.Repaired = what
		f = sf
	case err != nil:
		fc.Problem = problemOf(err)
		return &checkedFile{fc: fc}, nil
	}
	fc.Rank, fc.Kind, fc.StackID = int(f.sb.Rank), f.sb.Kind, f.sb.StackID
	fc.Epoch, fc.Slots, fc.SlotBytes, fc.Format = f.sb.Epoch, f.sb.Slots, f.sb.SlotBytes, f.version()
	if info.truncatedAt > 0 {
		fc.Problem = fmt.Sprintf("truncated: %d bytes, its superblock says %d; slots %d..%d are gone",
			info.truncatedAt, f.fileSize(), f.sb.Slots-info.lostSlots, f.sb.Slots-1)
		if opts.Repair {
			fc.Repaired = fmt.Sprintf("extended back to %d bytes; the %d slots below the cut kept", f.fileSize(), f.sb.Slots-info.lostSlots)
		}
	}
	return &checkedFile{fc: fc, f: f}, nil
}

// problemOf words why a slab file is unusable.
func problemOf(err error) string {
	switch {
	case errors.Is(err, diskfs.ErrNotRegular):
		return "not a regular file: " + err.Error()
	case errors.Is(err, ErrTruncated):
		return "truncated: " + err.Error()
	case errors.Is(err, ErrBadHeader):
		return "superblock unreadable (the store's next open recreates the file, losing its pages): " + err.Error()
	}
	return err.Error()
}

package badger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	badgerdb "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"github.com/dgraph-io/badger/v4/table"

	"github.com/kvtier/kvtier/indexes"
)

// openDB opens the Badger database in dir. A lock conflict wraps
// indexes.ErrInUse; anything else Badger refuses (a manifest, key registry
// or table it cannot read) or panics on wraps indexes.ErrCorrupt.
func openDB(cfg Config, dir string, log *slog.Logger) (db *badgerdb.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("open badger index %s: badger panicked reading its files: %v: %w", dir, r, indexes.ErrCorrupt)
		}
	}()
	// NB: Badger opens tables on goroutines of its own, where a damaged
	// table can panic (a nil block dereferenced on a checksum error) and
	// no recover of ours can reach; check every table here first.
	if err := verifyTables(dir, cfg.BadgerOptions(dir, log)); err != nil {
		return nil, err
	}
	if err := removeUnbornFiles(dir, log); err != nil {
		return nil, err
	}
	db, err = badgerdb.Open(cfg.BadgerOptions(dir, log))
	if err == nil {
		return db, nil
	}
	// Badger formats its lock error without %w (outside its debug
	// build), so the message is all there is to recognise it by.
	if strings.Contains(err.Error(), "Cannot acquire directory lock") {
		return nil, fmt.Errorf("open badger index %s: %w (%v)", dir, indexes.ErrInUse, err)
	}
	if isEnvironmental(err) || !opensEmpty(cfg, log) {
		// NB: the same options fail on an empty directory too: a
		// configuration or environment problem, not damage; never set a
		// healthy index aside for it.
		return nil, fmt.Errorf("open badger index %s: %w", dir, err)
	}
	return nil, fmt.Errorf("open badger index %s: %w: %w", dir, indexes.ErrCorrupt, err)
}

// opensEmpty reports whether Badger opens an empty database with cfg's
// options (in a temporary directory).
func opensEmpty(cfg Config, log *slog.Logger) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	dir, err := os.MkdirTemp("", "kvtier-badger-probe-")
	if err != nil {
		return false
	}
	defer func() { _ = os.RemoveAll(dir) }()
	db, err := badgerdb.Open(cfg.BadgerOptions(dir, slog.New(slog.DiscardHandler)))
	if err != nil {
		log.Debug("badger index: an empty database does not open with these options either", "err", err)
		return false
	}
	_ = db.Close()
	return true
}

// isEnvironmental reports errors that say nothing about the files' content:
// permissions, a full disk, too many open files.
func isEnvironmental(err error) bool {
	return errors.Is(err, os.ErrPermission) || strings.Contains(err.Error(), "no space left") ||
		strings.Contains(err.Error(), "too many open files")
}

// setAside moves the files of a damaged database into a sibling directory
// (on_corrupt: set_aside) so a fresh one can start, or refuses (refuse).
func setAside(dir string, cfg Config, damage error, log *slog.Logger) error {
	if cfg.OnCorrupt == OnCorruptRefuse {
		return fmt.Errorf("%w (on_corrupt: refuse; move the directory away or rebuild with kvtier inspect l3 --rebuild-index)", damage)
	}
	aside := fmt.Sprintf("%s.corrupt-%s", filepath.Clean(dir), time.Now().UTC().Format("20060102T150405.000000000"))
	if err := os.Mkdir(aside, 0o755); err != nil {
		return fmt.Errorf("%w; set aside: %w", damage, err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("%w; set aside: %w", damage, err)
	}
	for _, e := range ents {
		if e.Name() == lockFileName {
			continue
		}
		if err := os.Rename(filepath.Join(dir, e.Name()), filepath.Join(aside, e.Name())); err != nil {
			return fmt.Errorf("%w; set aside %s: %w", damage, e.Name(), err)
		}
	}
	log.Error("badger index damaged; set aside and started empty (the store rebuilds its entries)",
		"dir", dir, "set_aside_as", aside, "reason", damage.Error())
	return nil
}

// recoverPanic turns a panic inside Badger (a damaged table read before
// its checksum could be checked) into an error wrapping indexes.ErrCorrupt
// at the index boundary, so a damaged file never takes the host down.
func (ix *Index) recoverPanic(op string, err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("badger index %s: %s: badger panicked reading its files: %v: %w", ix.dir, op, r, indexes.ErrCorrupt)
		ix.log.Error("badger index: panic inside badger turned into an error", "dir", ix.dir, "op", op, "panic", fmt.Sprint(r))
	}
}

// OpenDamage implements indexes.Recoverer: why Open set the database's
// files aside, or nil.
func (ix *Index) OpenDamage() error { return ix.openDamage }

// Reset implements indexes.Resetter: it drops every entry.
func (ix *Index) Reset(ctx context.Context) (err error) {
	defer ix.recoverPanic("reset", &err)
	release, err := ix.enter(ctx, "reset")
	if err != nil {
		return err
	}
	defer release()
	ix.writeMu.Lock()
	defer ix.writeMu.Unlock()
	if err := ix.db.DropAll(); err != nil {
		return fmt.Errorf("badger index %s: reset: %w", ix.dir, err)
	}
	return nil
}

// verifyTables reads every table (*.sst) of dir on this goroutine and
// verifies its index and block checksums and walks its entries, turning
// any error or panic into an error wrapping indexes.ErrCorrupt that names
// the file.
func verifyTables(dir string, opt badgerdb.Options) error {
	paths, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	if err != nil {
		return fmt.Errorf("open badger index %s: %w", dir, err)
	}
	live := manifestTables(dir, opt)
	for _, p := range paths {
		if id, ok := table.ParseFileID(filepath.Base(p)); ok && live != nil {
			if _, ok := live[id]; !ok {
				// NB: a table the MANIFEST does not name was being
				// written by a process killed before it was added (a
				// flush or a compaction): it holds nothing the index
				// needs, and Badger deletes it at open.
				continue
			}
		}
		if err := verifyTable(p); err != nil {
			return fmt.Errorf("open badger index %s: table %s: %w: %w", dir, filepath.Base(p), err, indexes.ErrCorrupt)
		}
	}
	return nil
}

// manifestTables returns the ids of the tables dir's MANIFEST names, or
// nil when it cannot be read (then every table is checked, and Badger
// refuses the manifest itself).
func manifestTables(dir string, opt badgerdb.Options) (ids map[uint64]badgerdb.TableManifest) {
	defer func() {
		if recover() != nil {
			ids = nil
		}
	}()
	f, err := os.Open(filepath.Join(dir, badgerdb.ManifestFilename))
	if err != nil {
		return nil
	}
	defer func() { _ = f.Close() }()
	mf, _, err := badgerdb.ReplayManifestFile(f, opt.ExternalMagicVersion, opt)
	if err != nil {
		return nil
	}
	return mf.Tables
}

func verifyTable(path string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("badger panicked reading it: %v", r)
		}
	}()
	id, ok := table.ParseFileID(filepath.Base(path))
	if !ok {
		return fmt.Errorf("not a table file name")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	opts := table.Options{ChkMode: options.OnTableAndBlockRead, Compression: options.None}
	t, err := table.OpenInMemoryTable(data, id, &opts)
	if err != nil {
		return err
	}
	// NB: the blocks' checksums cover the entries, so walking them
	// (which costs as much again) adds nothing once they verify.
	return t.VerifyChecksum()
}

// removeUnbornFiles removes memtable (*.mem) and value log (*.vlog) files
// of zero bytes. Badger creates such a file and then sizes, maps and (for
// a value log) heads it; a process killed in between (a SIGKILL during
// Open, a memtable rotation or a value log roll) leaves an empty file that
// holds no entry, and every later Open fails on it with "Create a new
// file" (dgraph-io/badger#2207) — which would otherwise read as damage and
// cost the whole index. A file with any byte is Badger's to replay or
// refuse, and is left alone.
func removeUnbornFiles(dir string, log *slog.Logger) error {
	var files []string
	for _, pat := range []string{"*.mem", "*.vlog"} {
		m, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			return fmt.Errorf("open badger index %s: list %s: %w", dir, pat, err)
		}
		files = append(files, m...)
	}
	for _, p := range files {
		fi, err := os.Lstat(p)
		if err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
			continue
		}
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("open badger index %s: remove the empty file %s a killed process left (dgraph-io/badger#2207; remove it by hand): %w", dir, p, err)
		}
		log.Warn("badger index: removed an empty file left by a process killed while creating it (dgraph-io/badger#2207); it held no entry",
			"dir", dir, "file", filepath.Base(p))
	}
	return nil
}

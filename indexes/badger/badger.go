// Package badger implements Index v1 on dgraph-io/badger/v4, an LSM tree
// kept in one directory by one process.
//
// Keys are the 33-byte indexes.EncodeKey form and values the 32-byte
// canonical record (indexes.EncodeRecord), stored inline in the LSM tree
// (below the 1 KiB value threshold this package sets), so the value log is
// never used for them and needs no garbage collection. Compression is off (a record is
// random bytes), the block cache small, and Badger's conflict detection is
// off: every write transaction of an Index runs under Index.writeMu, so no
// transaction ever commits between another's read and its write and there
// is nothing to detect. The directory is locked: a second opener, in this
// process or another, gets indexes.ErrInUse.
//
// A record that fails to decode (indexes.ErrCorrupt) is reported by Get and
// Iterate after they have answered every other key, and treated as absent
// by Touch and DeleteIf; Delete and Put replace it.
//
// This package must never be opened by two processes on one directory (use
// indexes/lmdb to share an index between the ranks of a node) and never
// hold a transaction across calls.
package badger

import (
	"github.com/kvtier/kvtier/internal/invariants"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	badgerdb "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/registry"
)

// Name is the registry name of this index.
const Name = "badger"

// lockFileName is the file in the index directory that Open locks with
// flock(2) before Badger opens, so that a second opener is told
// indexes.ErrInUse rather than Badger's unwrapped lock message.
const lockFileName = "kvtier-index.lock"

// maxScratch is the largest write buffer an Index keeps between batches.
const maxScratch = 4 << 20

// entrySize is the bytes of one encoded key and record in a batch buffer.
const entrySize = indexes.KeySize + indexes.RecordSize

// Index is a Badger-backed Index v1.
type Index struct {
	db   *badgerdb.DB
	lock *os.File
	log  *slog.Logger
	m    *indexes.Metrics
	dir  string

	// openDamage is why Open set damaged files aside, or nil.
	openDamage error

	// gate admits calls until Close, which waits for those in flight.
	gate indexes.CloseGate
	// writeMu serializes write transactions; it is why conflict detection
	// can be off (see the package comment).
	writeMu sync.Mutex
	// scratch holds the encoded keys and values of the write transaction
	// in progress; guarded by writeMu. Badger references them until the
	// commit returns, having copied them into its memtable by then.
	scratch []byte
}

var (
	_ indexes.Index     = (*Index)(nil)
	_ indexes.Resetter  = (*Index)(nil)
	_ indexes.Recoverer = (*Index)(nil)
)

// Register adds the Badger index to r under indexes.IndexV1 and Name.
func Register(r *indexes.Registry) error {
	return r.Register(registry.Registration[indexes.Factory]{
		Type:      indexes.IndexV1,
		Name:      Name,
		Doc:       "single-process Badger (LSM) index in one directory",
		NewConfig: registry.NewConfigOf(DefaultConfig),
		Factory: func(ctx context.Context, env indexes.Env, cfg any) (indexes.Index, error) {
			c, err := registry.ConfigAs(Name+" index", cfg, DefaultConfig)
			if err != nil {
				return nil, err
			}
			// NB: a failed open must return a nil interface, not one
			// holding a nil pointer.
			m, err := Open(ctx, env, c)
			if err != nil {
				return nil, err
			}
			return m, nil
		},
	})
}

// Open opens (creating if needed) the index in cfg.Dir, or env.Dir when
// cfg.Dir is empty. It returns indexes.ErrInUse when another opener holds
// the directory.
func Open(ctx context.Context, env indexes.Env, cfg Config) (*Index, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dir, err := env.PrepareDir(ctx, Name, cfg.Dir)
	if err != nil {
		return nil, err
	}
	m, err := indexes.NewMetrics(env.Registerer, Name)
	if err != nil {
		return nil, fmt.Errorf("open badger index %s: %w", dir, err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	db, err := openDB(cfg, dir, env.Logger)
	var damage error
	if err != nil && !errors.Is(err, indexes.ErrInUse) && errors.Is(err, indexes.ErrCorrupt) {
		damage = err
		if err := setAside(dir, cfg, damage, env.Logger); err != nil {
			_ = lock.Close()
			return nil, err
		}
		db, err = openDB(cfg, dir, env.Logger)
	}
	if err != nil {
		_ = lock.Close()
		return nil, err
	}
	env.Logger.Debug("badger index open", "dir", dir, "config", cfg.String())
	return &Index{db: db, lock: lock, log: env.Logger, m: m, dir: dir, openDamage: damage}, nil
}

// BadgerOptions returns the Badger options Open uses for a database in
// dir, so that benchmarks against the raw library run the same settings.
func (c Config) BadgerOptions(dir string, log *slog.Logger) badgerdb.Options {
	return badgerdb.DefaultOptions(dir).
		WithSyncWrites(c.Sync).
		WithCompression(options.None).
		WithBlockCacheSize(c.BlockCacheBytes).
		WithMemTableSize(c.MemTableBytes).
		WithNumMemtables(2).
		WithNumCompactors(2).
		WithDetectConflicts(false).
		WithNumVersionsToKeep(1).
		// NB: verify table checksums at open and block checksums on
		// every read from disk, so a damaged table is an error, not a
		// slice-bounds panic deep in the table iterator.
		WithChecksumVerificationMode(options.OnTableAndBlockRead).
		// NB: records are 32 bytes and always stay in the LSM tree; a
		// small threshold also lets small memtables open (Badger refuses a
		// threshold above 15% of the memtable).
		WithValueThreshold(1 << 10).
		// NB: Badger's metrics are process-global expvars, shared by every
		// database of the process; they would mix indexes.
		WithMetricsEnabled(false).
		WithLogger(slogAdapter{log.With("index", Name, "dir", dir)})
}

// lockDir takes the kvtier lock of dir.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open badger index lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("open badger index %s: %w", dir, indexes.ErrInUse)
		}
		return nil, fmt.Errorf("lock badger index %s: %w", path, err)
	}
	return f, nil
}

// enter admits a call unless the index is closed or ctx is done; the
// caller runs the returned release when the call ends.
func (ix *Index) enter(ctx context.Context, op string) (release func(), err error) {
	if !ix.gate.Enter() {
		return nil, fmt.Errorf("%s index %s: %s: %w", Name, ix.dir, op, indexes.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		ix.gate.Exit()
		return nil, fmt.Errorf("%s index %s: %s: %w", Name, ix.dir, op, err)
	}
	return ix.gate.Exit, nil
}

// update runs fn in one write transaction under writeMu and commits it.
// fn gets a zeroed scratch buffer of size bytes that lives until the
// commit returns.
func (ix *Index) update(op string, n, size int, fn func(txn *badgerdb.Txn, buf []byte) error) error {
	ix.writeMu.Lock()
	defer ix.writeMu.Unlock()
	var buf []byte
	switch {
	case size > maxScratch:
		buf = make([]byte, size) // a rare huge batch is not kept
	case cap(ix.scratch) < size:
		ix.scratch = make([]byte, size)
		buf = ix.scratch
	default:
		buf = ix.scratch[:size]
		clear(buf)
	}
	txn := ix.db.NewTransaction(true)
	defer txn.Discard()
	if err := fn(txn, buf); err != nil {
		return ix.wrapTxnErr(op, n, err)
	}
	if err := txn.Commit(); err != nil {
		return ix.wrapTxnErr(op, n, err)
	}
	return nil
}

func (ix *Index) wrapTxnErr(op string, n int, err error) error {
	if errors.Is(err, badgerdb.ErrTxnTooBig) {
		return fmt.Errorf("badger index %s: %s batch of %d exceeds one transaction (at most %d entries; raise memtable_bytes): %w",
			ix.dir, op, n, ix.db.MaxBatchCount(), err)
	}
	return fmt.Errorf("badger index %s: %s batch of %d: %w", ix.dir, op, n, err)
}

// Put inserts or replaces the entries in one transaction.
func (ix *Index) Put(ctx context.Context, entries []indexes.Entry) (err error) {
	defer ix.m.Done(indexes.OpPut, len(entries), &err)
	defer ix.recoverPanic("put", &err)
	release, err := ix.enter(ctx, "put")
	if err != nil {
		return err
	}
	defer release()
	if len(entries) == 0 {
		return nil
	}
	// NB: Badger keeps the key and value slices until commit, so each
	// entry gets its own region of the scratch buffer.
	return ix.update("put", len(entries), len(entries)*entrySize, func(txn *badgerdb.Txn, buf []byte) error {
		for i, e := range entries {
			kb, vb := entryBuf(buf, i)
			indexes.EncodeKey(kb, e.Key)
			indexes.EncodeRecord(vb, e.Key, e.Record)
			if err := txn.Set(kb[:], vb[:]); err != nil {
				return fmt.Errorf("set %s: %w", e.Key, err)
			}
		}
		if invariants.Enabled {
			ix.checkWritten(txn, entries)
		}
		return nil
	})
}

// Get looks keys up in one read transaction. A record that fails to decode
// is reported absent and named in an error wrapping indexes.ErrCorrupt,
// returned after every key has been answered.
func (ix *Index) Get(ctx context.Context, keys []indexes.Key, dst []indexes.Record, found []bool) (err error) {
	defer ix.m.Done(indexes.OpGet, len(keys), &err)
	defer ix.recoverPanic("get", &err)
	if len(dst) != len(keys) || len(found) != len(keys) {
		return fmt.Errorf("badger index %s: get %d keys into %d records and %d found flags: %w", ix.dir, len(keys), len(dst), len(found), indexes.ErrInvalid)
	}
	release, err := ix.enter(ctx, "get")
	if err != nil {
		return err
	}
	defer release()
	if len(keys) == 0 {
		return nil
	}
	var corrupt corruptKeys
	err = ix.db.View(func(txn *badgerdb.Txn) error {
		var kb [indexes.KeySize]byte
		for i, k := range keys {
			dst[i], found[i] = indexes.Record{}, false
			indexes.EncodeKey(&kb, k)
			item, err := txn.Get(kb[:])
			if errors.Is(err, badgerdb.ErrKeyNotFound) {
				continue
			}
			if err != nil {
				return fmt.Errorf("get %s: %w", k, err)
			}
			if err := item.Value(func(v []byte) error {
				rec, err := indexes.DecodeRecord(k, v)
				if err != nil {
					corrupt.add(err)
					return nil
				}
				dst[i], found[i] = rec, true
				return nil
			}); err != nil {
				return fmt.Errorf("read %s: %w", k, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("badger index %s: get batch of %d: %w", ix.dir, len(keys), err)
	}
	ix.m.Corrupt.Add(float64(corrupt.n))
	return corrupt.err(ix.dir, "get")
}

// Delete removes keys in one transaction; absent keys are ignored.
func (ix *Index) Delete(ctx context.Context, keys []indexes.Key) (err error) {
	defer ix.m.Done(indexes.OpDelete, len(keys), &err)
	defer ix.recoverPanic("delete", &err)
	release, err := ix.enter(ctx, "delete")
	if err != nil {
		return err
	}
	defer release()
	if len(keys) == 0 {
		return nil
	}
	return ix.update("delete", len(keys), len(keys)*indexes.KeySize, func(txn *badgerdb.Txn, buf []byte) error {
		for i, k := range keys {
			kb := (*[indexes.KeySize]byte)(buf[i*indexes.KeySize:])
			indexes.EncodeKey(kb, k)
			if err := txn.Delete(kb[:]); err != nil {
				return fmt.Errorf("delete %s: %w", k, err)
			}
		}
		if invariants.Enabled {
			ix.checkAbsent(txn, keys)
		}
		return nil
	})
}

// DeleteIf removes each entry's key when its stored record has the same
// disk, slot and epoch, in one transaction. Entries are applied in order,
// so a key named twice is deleted at most once.
func (ix *Index) DeleteIf(ctx context.Context, entries []indexes.Entry, deleted []bool) (err error) {
	defer ix.m.Done(indexes.OpDeleteIf, len(entries), &err)
	defer ix.recoverPanic("delete-if", &err)
	if len(deleted) != len(entries) {
		return fmt.Errorf("badger index %s: delete-if %d entries with %d result flags: %w", ix.dir, len(entries), len(deleted), indexes.ErrInvalid)
	}
	release, err := ix.enter(ctx, "delete-if")
	if err != nil {
		return err
	}
	defer release()
	if len(entries) == 0 {
		return nil
	}
	res := make([]bool, len(entries))
	err = ix.update("delete-if", len(entries), len(entries)*indexes.KeySize, func(txn *badgerdb.Txn, buf []byte) error {
		for i, e := range entries {
			kb := (*[indexes.KeySize]byte)(buf[i*indexes.KeySize:])
			indexes.EncodeKey(kb, e.Key)
			rec, ok, err := ix.readRecord(txn, kb[:], e.Key)
			if err != nil {
				return err
			}
			if !ok || !rec.SameLocation(e.Record) {
				continue
			}
			if err := txn.Delete(kb[:]); err != nil {
				return fmt.Errorf("delete %s: %w", e.Key, err)
			}
			res[i] = true
		}
		if invariants.Enabled {
			var gone []indexes.Key
			for i, e := range entries {
				if res[i] {
					gone = append(gone, e.Key)
				}
			}
			ix.checkAbsent(txn, gone)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Results are published only for a committed batch.
	copy(deleted, res)
	return nil
}

// Touch sets LastAccess of the present keys to at, in one transaction.
func (ix *Index) Touch(ctx context.Context, keys []indexes.Key, at uint64) (err error) {
	defer ix.m.Done(indexes.OpTouch, len(keys), &err)
	defer ix.recoverPanic("touch", &err)
	release, err := ix.enter(ctx, "touch")
	if err != nil {
		return err
	}
	defer release()
	if len(keys) == 0 {
		return nil
	}
	return ix.update("touch", len(keys), len(keys)*entrySize, func(txn *badgerdb.Txn, buf []byte) error {
		for i, k := range keys {
			kb, vb := entryBuf(buf, i)
			indexes.EncodeKey(kb, k)
			rec, ok, err := ix.readRecord(txn, kb[:], k)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			rec.LastAccess = at
			indexes.EncodeRecord(vb, k, rec)
			if err := txn.Set(kb[:], vb[:]); err != nil {
				return fmt.Errorf("set %s: %w", k, err)
			}
		}
		if invariants.Enabled {
			ix.checkTouched(txn, keys, at)
		}
		return nil
	})
}

// readRecord reads and decodes, inside txn, the record of k, whose encoded
// form is kb. A corrupt record is logged and reported absent.
func (ix *Index) readRecord(txn *badgerdb.Txn, kb []byte, k indexes.Key) (indexes.Record, bool, error) {
	item, err := txn.Get(kb)
	if errors.Is(err, badgerdb.ErrKeyNotFound) {
		return indexes.Record{}, false, nil
	}
	if err != nil {
		return indexes.Record{}, false, fmt.Errorf("get %s: %w", k, err)
	}
	var rec indexes.Record
	var ok bool
	if err := item.Value(func(v []byte) error {
		r, err := indexes.DecodeRecord(k, v)
		if err != nil {
			ix.m.Corrupt.Inc()
			ix.log.Warn("badger index: treating a corrupt record as absent", "dir", ix.dir, "err", err)
			return nil
		}
		rec, ok = r, true
		return nil
	}); err != nil {
		return indexes.Record{}, false, fmt.Errorf("read %s: %w", k, err)
	}
	return rec, ok, nil
}

// Iterate calls fn for every entry in key order from one read transaction.
// A record that fails to decode is skipped and named in an error wrapping
// indexes.ErrCorrupt, returned after the iteration completes.
func (ix *Index) Iterate(ctx context.Context, fn func(indexes.Entry) error) (err error) {
	yielded := 0
	defer func() { ix.m.Done(indexes.OpIterate, yielded, &err) }()
	defer ix.recoverPanic("iterate", &err)
	release, err := ix.enter(ctx, "iterate")
	if err != nil {
		return err
	}
	defer release()
	var corrupt corruptKeys
	err = ix.db.View(func(txn *badgerdb.Txn) error {
		opts := badgerdb.DefaultIteratorOptions
		opts.PrefetchValues = false
		it := txn.NewIterator(opts)
		defer it.Close()
		var prev []byte // for the invariants build only
		n := 0
		for it.Rewind(); it.Valid(); it.Next() {
			if n++; n%4096 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			item := it.Item()
			if invariants.Enabled {
				ix.checkOrder(&prev, item.Key())
			}
			k, err := indexes.DecodeKey(item.Key())
			if err != nil {
				corrupt.add(fmt.Errorf("key %x: %w", item.Key(), err))
				continue
			}
			var rec indexes.Record
			var ok bool
			if err := item.Value(func(v []byte) error {
				r, err := indexes.DecodeRecord(k, v)
				if err != nil {
					corrupt.add(err)
					return nil
				}
				rec, ok = r, true
				return nil
			}); err != nil {
				return fmt.Errorf("read %s: %w", k, err)
			}
			if !ok {
				continue
			}
			yielded++
			if err := fn(indexes.Entry{Key: k, Record: rec}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("badger index %s: iterate: %w", ix.dir, err)
	}
	ix.m.Corrupt.Add(float64(corrupt.n))
	return corrupt.err(ix.dir, "iterate")
}

// Stats counts the entries with a key-only scan (Badger keeps no count), so
// it costs time linear in the number of entries; Bytes is the disk space
// allocated to the directory's files. CapacityBytes is 0: Badger has no
// fixed limit.
func (ix *Index) Stats(ctx context.Context) (_ indexes.Stats, err error) {
	defer ix.m.Done(indexes.OpStats, 0, &err)
	defer ix.recoverPanic("stats", &err)
	release, err := ix.enter(ctx, "stats")
	if err != nil {
		return indexes.Stats{}, err
	}
	defer release()
	var st indexes.Stats
	err = ix.db.View(func(txn *badgerdb.Txn) error {
		opts := badgerdb.DefaultIteratorOptions
		opts.PrefetchValues = false
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			st.Entries++
		}
		return nil
	})
	if err != nil {
		return indexes.Stats{}, fmt.Errorf("badger index %s: stats: %w", ix.dir, err)
	}
	files, err := os.ReadDir(ix.dir)
	if err != nil {
		return indexes.Stats{}, fmt.Errorf("badger index %s: stats: %w", ix.dir, err)
	}
	for _, f := range files {
		info, err := f.Info()
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		// NB: Badger preallocates its log files sparsely (gigabytes of
		// apparent size for a few records), so count allocated blocks.
		if sys, ok := info.Sys().(*syscall.Stat_t); ok {
			st.Bytes += sys.Blocks * 512
		} else {
			st.Bytes += info.Size()
		}
	}
	return st, nil
}

// Close refuses new calls with indexes.ErrClosed, waits for the calls in
// flight, closes the database and releases the directory lock. A second
// Close returns nil. Close must not be called from inside an Iterate
// callback of the same Index: it would wait for that very call.
func (ix *Index) Close() error {
	if !ix.gate.Close() {
		return nil
	}
	var errs []error
	if err := ix.db.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close badger index %s: %w", ix.dir, err))
	}
	if err := ix.lock.Close(); err != nil {
		errs = append(errs, fmt.Errorf("release badger index lock %s: %w", ix.dir, err))
	}
	return errors.Join(errs...)
}

// entryBuf returns the key and value regions of entry i of a batch buffer.
func entryBuf(buf []byte, i int) (*[indexes.KeySize]byte, *[indexes.RecordSize]byte) {
	b := buf[i*entrySize : (i+1)*entrySize]
	return (*[indexes.KeySize]byte)(b[:indexes.KeySize]), (*[indexes.RecordSize]byte)(b[indexes.KeySize:])
}

// corruptKeys collects decode failures of one call.
type corruptKeys struct {
	n     int
	first []error
}

func (c *corruptKeys) add(err error) {
	c.n++
	if len(c.first) < 4 {
		c.first = append(c.first, err)
	}
}

func (c *corruptKeys) err(dir, op string) error {
	if c.n == 0 {
		return nil
	}
	return fmt.Errorf("badger index %s: %s: %d corrupt records, first: %w", dir, op, c.n, errors.Join(c.first...))
}

// slogAdapter routes Badger's log lines to a *slog.Logger. Badger's info
// lines (compactions, replay) are debug-level noise for kvtier.
type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Errorf(f string, v ...any) { a.l.Error(strings.TrimSpace(fmt.Sprintf(f, v...))) }
func (a slogAdapter) Warningf(f string, v ...any) {
	a.l.Warn(strings.TrimSpace(fmt.Sprintf(f, v...)))
}
func (a slogAdapter) Infof(f string, v ...any)  { a.l.Debug(strings.TrimSpace(fmt.Sprintf(f, v...))) }
func (a slogAdapter) Debugf(f string, v ...any) { a.l.Debug(strings.TrimSpace(fmt.Sprintf(f, v...))) }

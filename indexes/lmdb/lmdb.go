// Package lmdb implements Index v1 on LMDB (github.com/PowerDNS/lmdb-go):
// one memory-mapped B+tree environment that every rank process of a node
// opens at once, readers never blocking the single writer.
//
// Keys are the 33-byte indexes.EncodeKey form and values the 32-byte
// canonical record (indexes.EncodeRecord), in one named database. Each
// batch is one write transaction. The map size is fixed at open (config):
// a put batch that does not fit fails whole with indexes.ErrFull — every
// earlier entry stays intact and the environment stays usable, so the
// caller stops admitting pages and frees some. Puts stop short of the
// map's end so that deletes, which LMDB's copy-on-write makes need free
// pages too, always find room to free some (reserve.go).
// Reader slots left by processes that died inside a read transaction are
// cleared at open (mdb_reader_check), so they cannot pin old pages.
//
// A record that fails to decode (indexes.ErrCorrupt) is reported by Get and
// Iterate after they have answered every other key, and treated as absent
// by Touch and DeleteIf; Delete and Put replace it.
//
// This package must never open one environment twice in one process (LMDB
// forbids it: closing either handle drops the other's POSIX locks); Open
// refuses the second attempt, and ranks living in one process share one
// *Index. It must never grow the map behind the operator's back.
package lmdb

import (
	"github.com/kvtier/kvtier/internal/invariants"

	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	mdb "github.com/PowerDNS/lmdb-go/lmdb"
	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/registry"
)

// Name is the registry name of this index.
const Name = "lmdb"

// dbName is the named database inside the environment that holds entries.
const dbName = "kvtier.index.v1"

// procLockFileName is the file whose byte at offset pid this process locks
// (an open-file-description lock) while it has the environment open, which
// detects a second open in the same process without package state. Like
// LMDB's own reader table, it assumes every process sharing the directory
// sees one pid namespace.
const procLockFileName = "kvtier-index.procs"

// Index is an LMDB-backed Index v1.
type Index struct {
	env      *mdb.Env
	dbi      mdb.DBI
	procLock *os.File
	log      *slog.Logger
	m        *indexes.Metrics
	dir      string
	mapSize  int64
	// psize is the environment's page size.
	psize int64

	// staleReaders is how many dead processes' reader slots Open cleared.
	staleReaders int
	// settles counts the settling commits room made (see settle).
	settles atomic.Int64
	// openDamage is why Open set a damaged data file aside, or nil.
	openDamage error

	// gate admits calls until Close, which waits for those in flight.
	gate indexes.CloseGate
	// flushes is whether a commit flushes (Config.Sync is not "none").
	flushes bool
	// writeMu serializes this process's write transactions before they
	// queue on LMDB's cross-process writer mutex, so at most one OS thread
	// per process is parked on it.
	writeMu sync.Mutex
}

var (
	_ indexes.Index     = (*Index)(nil)
	_ indexes.Resetter  = (*Index)(nil)
	_ indexes.Recoverer = (*Index)(nil)

	_ indexes.DeferredPutter = (*Index)(nil)
)

// Register adds the LMDB index to r under indexes.IndexV1 and Name.
func Register(r *indexes.Registry) error {
	return r.Register(registry.Registration[indexes.Factory]{
		Type:      indexes.IndexV1,
		Name:      Name,
		Doc:       "LMDB index shared by every rank process of a node, fixed map size",
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

// Open opens (creating if needed) the environment in cfg.Dir, or env.Dir
// when cfg.Dir is empty, and clears stale reader slots. Other processes may
// have it open at the same time.
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
		return nil, fmt.Errorf("open lmdb index %s: %w", dir, err)
	}
	// NB: check the data file before LMDB maps it, and before this
	// process takes its slot, so a sole opener can set a damaged file
	// aside: a mapped page past the end of a truncated file is a SIGBUS,
	// and a page of the wrong type an assertion in mdb.c, neither of
	// which a Go program can recover from.
	// A file another process has open was checked by that process's Open
	// and is being written under it; reading it now could catch a commit
	// half done, so only the first opener checks.
	var damage error
	if pid := otherOpeners(dir); pid == "" {
		damage = verifyWithRetry(filepath.Join(dir, dataFileName))
	} else {
		env.Logger.Debug("lmdb index: data file check skipped, the environment is open in another process", "dir", dir, "pid", pid)
	}
	if damage != nil {
		if err := setAside(dir, cfg, damage, env.Logger); err != nil {
			return nil, err
		}
	}
	procLock, err := lockProcessSlot(dir)
	if err != nil {
		return nil, err
	}
	ix, err := openEnv(dir, cfg, env.Logger)
	if err != nil && damage == nil && isInvalidFile(err) {
		// LMDB itself calls the file invalid (a meta page VerifyFile
		// accepted but LMDB does not, or a lock file of another format).
		damage = err
		_ = procLock.Close()
		if err := setAside(dir, cfg, damage, env.Logger); err != nil {
			return nil, err
		}
		if procLock, err = lockProcessSlot(dir); err != nil {
			return nil, err
		}
		ix, err = openEnv(dir, cfg, env.Logger)
	}
	if err != nil {
		_ = procLock.Close()
		return nil, err
	}
	ix.procLock, ix.m, ix.openDamage = procLock, m, damage
	return ix, nil
}

func openEnv(dir string, cfg Config, log *slog.Logger) (*Index, error) {
	e, err := mdb.NewEnv()
	if err != nil {
		return nil, fmt.Errorf("open lmdb index %s: %w", dir, err)
	}
	fail := func(what string, err error) (*Index, error) {
		_ = e.Close()
		return nil, fmt.Errorf("open lmdb index %s: %s: %w", dir, what, err)
	}
	if err := e.SetMapSize(cfg.MapSizeBytes); err != nil {
		return fail("set map size", err)
	}
	if err := e.SetMaxReaders(cfg.MaxReaders); err != nil {
		return fail("set max readers", err)
	}
	if err := e.SetMaxDBs(1); err != nil {
		return fail("set max dbs", err)
	}
	if err := e.Open(dir, cfg.EnvFlags(), 0o644); err != nil {
		return fail("mdb_env_open", err)
	}
	stale, err := e.ReaderCheck()
	if err != nil {
		return fail("clear stale readers", err)
	}
	if stale > 0 {
		log.Warn("lmdb index: cleared reader slots of dead processes", "dir", dir, "slots", stale)
	}
	info, err := e.Info()
	if err != nil {
		return fail("env info", err)
	}
	if info.MapSize != cfg.MapSizeBytes {
		// Another process created the environment with a larger map;
		// LMDB keeps the larger one. Say so: the ranks disagree.
		log.Warn("lmdb index: map size differs from the config; configure every rank alike",
			"dir", dir, "configured", cfg.MapSizeBytes, "effective", info.MapSize)
	}
	est, err := e.Stat()
	if err != nil {
		return fail("env stat", err)
	}
	ix := &Index{env: e, log: log, dir: dir, mapSize: info.MapSize, psize: int64(est.PSize), staleReaders: stale, flushes: cfg.Sync != SyncNone}
	err = e.Update(func(txn *mdb.Txn) error {
		ix.dbi, err = txn.OpenDBI(dbName, mdb.Create)
		return err
	})
	if err != nil {
		if isErrno(err, mdb.MapFull) {
			err = fmt.Errorf("%w: %w", indexes.ErrFull, err)
		}
		return fail("open database "+dbName, err)
	}
	log.Debug("lmdb index open", "dir", dir, "config", cfg.String(), "stale_readers", stale)
	return ix, nil
}

// EnvFlags returns the mdb_env_open flags Open uses, so that benchmarks
// against the raw library run the same settings.
func (c Config) EnvFlags() uint {
	// NB: lookups are point reads of random hashes; readahead only
	// evicts useful pages when the map outgrows memory.
	flags := uint(mdb.NoReadahead)
	switch c.Sync {
	case SyncNoMeta:
		flags |= mdb.NoMetaSync
	case SyncNone:
		flags |= mdb.NoSync
	}
	return flags
}

// lockProcessSlot locks the byte at offset pid of dir's process-lock file
// with an open-file-description lock. Such locks conflict between two opens
// of the file even within one process, and locks at different offsets never
// conflict, so other processes (other pids) share the environment freely
// while this process cannot open it twice.
func lockProcessSlot(dir string) (*os.File, error) {
	path := filepath.Join(dir, procLockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lmdb index lock %s: %w", path, err)
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: int64(os.Getpid()), Len: 1}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
			return nil, fmt.Errorf("open lmdb index %s: already open in this process (pid %d); share the one *Index between ranks of a process", dir, os.Getpid())
		}
		return nil, fmt.Errorf("lock lmdb index %s: %w", path, err)
	}
	return f, nil
}

// StaleReadersCleared returns how many reader slots of dead processes Open
// cleared.
func (ix *Index) StaleReadersCleared() int { return ix.staleReaders }

// Settles returns how many settling commits the index made: puts refused
// only because the last commit's frees were not reusable yet.
func (ix *Index) Settles() int64 { return ix.settles.Load() }

// ClearStaleReaders frees the reader slots of processes that died inside a
// read transaction (mdb_reader_check) and returns how many it freed. Open
// does it once; a long-lived host may call it periodically, since a slot
// pinned by a dead reader keeps LMDB from reusing freed pages.
func (ix *Index) ClearStaleReaders() (int, error) {
	release, err := ix.enter(context.Background(), "clear stale readers")
	if err != nil {
		return 0, err
	}
	defer release()
	n, err := ix.env.ReaderCheck()
	if err != nil {
		return 0, fmt.Errorf("lmdb index %s: clear stale readers: %w", ix.dir, err)
	}
	if n > 0 {
		ix.log.Warn("lmdb index: cleared reader slots of dead processes", "dir", ix.dir, "slots", n)
	}
	return n, nil
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

// update runs fn in one write transaction and commits it; an error from fn
// or from the commit aborts the whole batch.
//
// NB: LMDB write transactions must stay on one OS thread. env.Update locks
// the goroutine to its thread for the transaction and unlocks it after;
// since Go 1.10 those calls nest, so a caller that locked its own thread
// stays locked. fn never starts goroutines and never lets txn escape.
func (ix *Index) update(op string, n int, fn func(txn *mdb.Txn) error) error {
	return ix.updateFlush(op, n, true, fn)
}

// updateFlush is update; with flush false and a sync mode that flushes,
// the commit runs with MDB_NOSYNC (an environment flag, set and cleared
// under writeMu, so no other commit of this process runs without it).
func (ix *Index) updateFlush(op string, n int, flush bool, fn func(txn *mdb.Txn) error) (err error) {
	ix.writeMu.Lock()
	defer ix.writeMu.Unlock()
	if op == "put" {
		if err := ix.room(n); err != nil {
			return err
		}
	}
	if !flush && ix.flushes {
		if err := ix.env.SetFlags(mdb.NoSync); err != nil {
			return ix.wrapErr(op, n, fmt.Errorf("set MDB_NOSYNC: %w", err))
		}
		defer func() {
			if uerr := ix.env.UnsetFlags(mdb.NoSync); uerr != nil {
				// NB: mdb_env_set_flags fails only for a flag it cannot
				// change, and MDB_NOSYNC is changeable: broken invariant.
				panic(fmt.Sprintf("lmdb index %s: clear MDB_NOSYNC: %v", ix.dir, uerr))
			}
		}()
	}
	if err := ix.env.Update(fn); err != nil {
		return ix.wrapErr(op, n, err)
	}
	return nil
}

// view runs fn in one read transaction, a consistent snapshot. When every
// reader slot is taken it clears the slots of dead processes and, if that
// freed any, tries once more: a rank that was killed inside a read must not
// starve the survivors until the next Open.
func (ix *Index) view(op string, n int, fn func(txn *mdb.Txn) error) error {
	run := func(txn *mdb.Txn) error {
		// Values are decoded before the transaction ends, so they may
		// point into the map instead of being copied.
		txn.RawRead = true
		return fn(txn)
	}
	err := ix.env.View(run)
	if isErrno(err, mdb.ReadersFull) {
		// NB: READERS_FULL comes from mdb_txn_begin, so fn has not run.
		if freed, cerr := ix.env.ReaderCheck(); cerr == nil && freed > 0 {
			ix.log.Warn("lmdb index: reader table full; cleared reader slots of dead processes", "dir", ix.dir, "slots", freed)
			err = ix.env.View(run)
		}
	}
	if err != nil {
		return ix.wrapErr(op, n, err)
	}
	return nil
}

func (ix *Index) wrapErr(op string, n int, err error) error {
	switch {
	case isErrno(err, mdb.MapFull):
		return fmt.Errorf("lmdb index %s: %s batch of %d does not fit the %d-byte map (map_size_bytes); nothing of it was written: %w: %w",
			ix.dir, op, n, ix.mapSize, indexes.ErrFull, err)
	case isErrno(err, mdb.ReadersFull):
		return fmt.Errorf("lmdb index %s: %s: every reader slot is taken (raise max_readers): %w", ix.dir, op, err)
	case isErrno(err, mdb.Corrupted) || isErrno(err, mdb.PageNotFound):
		return fmt.Errorf("lmdb index %s: %s batch of %d: %w: %w", ix.dir, op, n, indexes.ErrCorrupt, err)
	case isErrno(err, mdb.MapResized):
		return fmt.Errorf("lmdb index %s: %s: another process grew the map beyond %d bytes; configure every rank with the same map_size_bytes: %w",
			ix.dir, op, ix.mapSize, err)
	}
	return fmt.Errorf("lmdb index %s: %s batch of %d: %w", ix.dir, op, n, err)
}

// isErrno reports whether err, however wrapped, carries LMDB's errno e.
// (lmdb-go's own Is* helpers look at the outermost error only.)
func isErrno(err error, e mdb.Errno) bool {
	var op *mdb.OpError
	if errors.As(err, &op) {
		return op.Errno == e
	}
	var en mdb.Errno
	return errors.As(err, &en) && en == e
}

// Put inserts or replaces the entries in one write transaction.
func (ix *Index) Put(ctx context.Context, entries []indexes.Entry) (err error) {
	return ix.put(ctx, entries, true)
}

// PutDeferred is Put committed without a flush (MDB_NOSYNC for this commit
// only): visible at once, durable once Sync (or a later flushing commit)
// returns.
func (ix *Index) PutDeferred(ctx context.Context, entries []indexes.Entry) (err error) {
	return ix.put(ctx, entries, false)
}

// Sync flushes every committed transaction to stable storage.
func (ix *Index) Sync(ctx context.Context) error {
	release, err := ix.enter(ctx, "sync")
	if err != nil {
		return err
	}
	defer release()
	if err := ix.env.Sync(true); err != nil {
		return fmt.Errorf("lmdb index %s: sync: %w", ix.dir, err)
	}
	return nil
}

func (ix *Index) put(ctx context.Context, entries []indexes.Entry, flush bool) (err error) {
	defer ix.m.Done(indexes.OpPut, len(entries), &err)
	release, err := ix.enter(ctx, "put")
	if err != nil {
		return err
	}
	defer release()
	if len(entries) == 0 {
		return nil
	}
	return ix.updateFlush("put", len(entries), flush, func(txn *mdb.Txn) error {
		var kb [indexes.KeySize]byte
		var vb [indexes.RecordSize]byte
		for i := range entries {
			indexes.EncodeKey(&kb, entries[i].Key)
			indexes.EncodeRecord(&vb, entries[i].Key, entries[i].Record)
			if err := txn.Put(ix.dbi, kb[:], vb[:], 0); err != nil {
				return err
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
	if len(dst) != len(keys) || len(found) != len(keys) {
		return fmt.Errorf("lmdb index %s: get %d keys into %d records and %d found flags: %w", ix.dir, len(keys), len(dst), len(found), indexes.ErrInvalid)
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
	err = ix.view("get", len(keys), func(txn *mdb.Txn) error {
		var kb [indexes.KeySize]byte
		for i := range keys {
			indexes.EncodeKey(&kb, keys[i])
			v, err := txn.Get(ix.dbi, kb[:])
			if err == nil {
				if dst[i], err = indexes.DecodeRecord(keys[i], v); err == nil {
					found[i] = true
					continue
				}
				corrupt.add(err)
			} else if !mdb.IsNotFound(err) {
				return fmt.Errorf("get %s: %w", keys[i], err)
			}
			dst[i], found[i] = indexes.Record{}, false
		}
		return nil
	})
	if err != nil {
		return err
	}
	ix.m.Corrupt.Add(float64(corrupt.n))
	return corrupt.err(ix.dir, "get")
}

// Delete removes keys in one write transaction; absent keys are ignored.
func (ix *Index) Delete(ctx context.Context, keys []indexes.Key) (err error) {
	defer ix.m.Done(indexes.OpDelete, len(keys), &err)
	release, err := ix.enter(ctx, "delete")
	if err != nil {
		return err
	}
	defer release()
	if len(keys) == 0 {
		return nil
	}
	return ix.update("delete", len(keys), func(txn *mdb.Txn) error {
		var kb [indexes.KeySize]byte
		for _, k := range keys {
			indexes.EncodeKey(&kb, k)
			if err := txn.Del(ix.dbi, kb[:], nil); err != nil && !mdb.IsNotFound(err) {
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
// disk, slot and epoch, in one write transaction. Entries are applied in
// order, so a key named twice is deleted at most once.
func (ix *Index) DeleteIf(ctx context.Context, entries []indexes.Entry, deleted []bool) (err error) {
	defer ix.m.Done(indexes.OpDeleteIf, len(entries), &err)
	if len(deleted) != len(entries) {
		return fmt.Errorf("lmdb index %s: delete-if %d entries with %d result flags: %w", ix.dir, len(entries), len(deleted), indexes.ErrInvalid)
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
	err = ix.update("delete-if", len(entries), func(txn *mdb.Txn) error {
		var kb [indexes.KeySize]byte
		for i, e := range entries {
			indexes.EncodeKey(&kb, e.Key)
			rec, ok, err := ix.readRecord(txn, kb[:], e.Key)
			if err != nil {
				return err
			}
			if !ok || !rec.SameLocation(e.Record) {
				continue
			}
			if err := txn.Del(ix.dbi, kb[:], nil); err != nil {
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

// Touch sets LastAccess of the present keys to at, in one write
// transaction.
func (ix *Index) Touch(ctx context.Context, keys []indexes.Key, at uint64) (err error) {
	defer ix.m.Done(indexes.OpTouch, len(keys), &err)
	release, err := ix.enter(ctx, "touch")
	if err != nil {
		return err
	}
	defer release()
	if len(keys) == 0 {
		return nil
	}
	return ix.update("touch", len(keys), func(txn *mdb.Txn) error {
		var kb [indexes.KeySize]byte
		var vb [indexes.RecordSize]byte
		for _, k := range keys {
			indexes.EncodeKey(&kb, k)
			rec, ok, err := ix.readRecord(txn, kb[:], k)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			rec.LastAccess = at
			indexes.EncodeRecord(&vb, k, rec)
			if err := txn.Put(ix.dbi, kb[:], vb[:], 0); err != nil {
				return err
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
func (ix *Index) readRecord(txn *mdb.Txn, kb []byte, k indexes.Key) (indexes.Record, bool, error) {
	v, err := txn.Get(ix.dbi, kb)
	if mdb.IsNotFound(err) {
		return indexes.Record{}, false, nil
	}
	if err != nil {
		return indexes.Record{}, false, fmt.Errorf("get %s: %w", k, err)
	}
	rec, err := indexes.DecodeRecord(k, v)
	if err != nil {
		ix.m.Corrupt.Inc()
		ix.log.Warn("lmdb index: treating a corrupt record as absent", "dir", ix.dir, "err", err)
		return indexes.Record{}, false, nil
	}
	return rec, true, nil
}

// Iterate calls fn for every entry in key order from one read transaction.
// A record that fails to decode is skipped and named in an error wrapping
// indexes.ErrCorrupt, returned after the iteration completes. The read
// transaction holds a reader slot and pins the pages of its snapshot for as
// long as fn takes.
func (ix *Index) Iterate(ctx context.Context, fn func(indexes.Entry) error) (err error) {
	yielded := 0
	defer func() { ix.m.Done(indexes.OpIterate, yielded, &err) }()
	release, err := ix.enter(ctx, "iterate")
	if err != nil {
		return err
	}
	defer release()
	var corrupt corruptKeys
	var fnErr error
	err = ix.view("iterate", 0, func(txn *mdb.Txn) error {
		cur, err := txn.OpenCursor(ix.dbi)
		if err != nil {
			return err
		}
		defer cur.Close()
		var prev []byte // for the invariants build only
		n := 0
		for op := uint(mdb.First); ; op = mdb.Next {
			kb, v, err := cur.Get(nil, nil, op)
			if mdb.IsNotFound(err) {
				return nil
			}
			if err != nil {
				return err
			}
			if n++; n%4096 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			if invariants.Enabled {
				ix.checkOrder(&prev, kb)
			}
			k, err := indexes.DecodeKey(kb)
			if err != nil {
				corrupt.add(fmt.Errorf("key %x: %w", kb, err))
				continue
			}
			rec, err := indexes.DecodeRecord(k, v)
			if err != nil {
				corrupt.add(err)
				continue
			}
			yielded++
			if err := fn(indexes.Entry{Key: k, Record: rec}); err != nil {
				fnErr = err
				return err
			}
		}
	})
	if fnErr != nil {
		// The callback's error is returned as itself, not as a failure
		// of the index.
		return fnErr
	}
	if err != nil {
		return err
	}
	ix.m.Corrupt.Add(float64(corrupt.n))
	return corrupt.err(ix.dir, "iterate")
}

// Stats returns the entry count (kept by LMDB, O(1)), the bytes of map in
// use (pages up to the last used one; freed pages are reused, never
// returned) and the map size.
func (ix *Index) Stats(ctx context.Context) (_ indexes.Stats, err error) {
	defer ix.m.Done(indexes.OpStats, 0, &err)
	release, err := ix.enter(ctx, "stats")
	if err != nil {
		return indexes.Stats{}, err
	}
	defer release()
	var st indexes.Stats
	err = ix.view("stats", 0, func(txn *mdb.Txn) error {
		s, err := txn.Stat(ix.dbi)
		if err != nil {
			return err
		}
		st.Entries = int64(s.Entries)
		return nil
	})
	if err != nil {
		return indexes.Stats{}, err
	}
	info, err := ix.env.Info()
	if err != nil {
		return indexes.Stats{}, fmt.Errorf("lmdb index %s: stats: %w", ix.dir, err)
	}
	es, err := ix.env.Stat()
	if err != nil {
		return indexes.Stats{}, fmt.Errorf("lmdb index %s: stats: %w", ix.dir, err)
	}
	st.Bytes = (info.LastPNO + 1) * int64(es.PSize)
	st.CapacityBytes = info.MapSize
	return st, nil
}

// Close refuses new calls with indexes.ErrClosed, waits for the calls in
// flight, closes this process's handle of the environment (other processes
// keep theirs) and releases the process slot. A second Close returns nil.
// Close must not be called from inside an Iterate callback of the same
// Index: it would wait for that very call.
func (ix *Index) Close() error {
	if !ix.gate.Close() {
		return nil
	}
	var errs []error
	if err := ix.env.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close lmdb index %s: %w", ix.dir, err))
	}
	// NB: the process slot is released only after LMDB has dropped its
	// locks, so a racing Open in this process cannot overlap them.
	if err := ix.procLock.Close(); err != nil {
		errs = append(errs, fmt.Errorf("release lmdb index process slot %s: %w", ix.dir, err))
	}
	return errors.Join(errs...)
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
	return fmt.Errorf("lmdb index %s: %s: %d corrupt records, first: %w", dir, op, c.n, errors.Join(c.first...))
}

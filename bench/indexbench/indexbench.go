// Package indexbench measures batched put and get through Index v1 against
// the raw library underneath (lmdb-go, badger) in the same run, with the
// same keys, values, batch sizes and database settings, and reports the
// ratio as internal/benchreport results. `kvtier bench l3` and the
// package's `go test -bench` benchmarks call it.
//
// The raw side is given every advantage the raw library allows: its keys
// and values are encoded before the clock starts and it decodes the fields
// of what it reads without a check, while the Index side encodes keys,
// builds and verifies the record CRC-32C and version inside the timed
// region. The two sides take turns on
// the same data a few batches at a time, each going first in turn, so that
// a noisy neighbour hurts both alike; each side's throughput is the
// inverse of its median time per entry over those chunks.
//
// This package must never be imported by production code paths; it opens
// throwaway databases under a directory it is given.
package indexbench

import (
	"github.com/kvtier/kvtier/internal/measure"

	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	mdb "github.com/PowerDNS/lmdb-go/lmdb"
	badgerdb "github.com/dgraph-io/badger/v4"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/badger"
	"github.com/kvtier/kvtier/indexes/lmdb"
	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/kvtier/kvtier/pagehash"
)

// Target is the ratio of Index v1 to raw-library throughput the project
// aims for.
const Target = 0.9

// Options sizes a run.
type Options struct {
	// Dir is where the throwaway databases go (a temporary directory is
	// made inside it and removed after). Empty means os.TempDir().
	Dir string
	// Entries is how many entries one round puts, in batches.
	Entries int
	// Batch is the number of entries per Put or Get call.
	Batch int
	// Rounds is how many rounds of Entries each side puts, and then gets.
	Rounds int
	// Sync runs both sides with their durable setting (an fsync per
	// batch); off (the default) measures the code path, not the disk.
	Sync bool
	// Seed makes the keys, records and lookup order.
	Seed uint64
}

// DefaultOptions returns 100,000 entries per round in batches of 256,
// five rounds, sync off.
func DefaultOptions() Options {
	return Options{Entries: 100_000, Batch: 256, Rounds: 5, Seed: 1}
}

func (o Options) validate() error {
	if o.Entries < 1 || o.Batch < 1 || o.Rounds < 1 {
		return fmt.Errorf("index bench: entries %d, batch %d and rounds %d must all be positive", o.Entries, o.Batch, o.Rounds)
	}
	return nil
}

func (o Options) note() string {
	sync := "sync off"
	if o.Sync {
		sync = "sync on"
	}
	return fmt.Sprintf("batch %d, %d entries x %d rounds, %s, sides interleaved every %d batches, median chunk, raw side pre-encoded and unchecked", o.Batch, o.Entries, o.Rounds, sync, chunkBatches)
}

// Run measures both indexes and returns put and get results for each.
func Run(ctx context.Context, opts Options) ([]benchreport.Result, error) {
	l, err := LMDB(ctx, opts)
	if err != nil {
		return nil, err
	}
	b, err := Badger(ctx, opts)
	if err != nil {
		return nil, err
	}
	return append(l, b...), nil
}

// Side is one implementation under test: Index v1 or the raw library.
// Its methods run one batch each.
type Side interface {
	// Put writes the batch of entries; keys and vals are the same
	// entries pre-encoded.
	Put(entries []indexes.Entry, keys, vals [][]byte) error
	// Get looks the batch up and fails if an entry is missing.
	Get(keys []indexes.Key, encoded [][]byte) error
	// Close releases the side.
	Close() error
}

// workload is the data of one run, shared by both sides.
type workload struct {
	rounds [][]indexes.Entry
	keys   [][][]byte // per round, encoded keys
	vals   [][][]byte // per round, encoded records
}

func newWorkload(o Options) workload {
	rng := rand.New(rand.NewPCG(o.Seed, 0x696e646578))
	w := workload{}
	for range o.Rounds {
		entries := make([]indexes.Entry, o.Entries)
		keys := make([][]byte, o.Entries)
		vals := make([][]byte, o.Entries)
		// One contiguous buffer per round, like the Index side's entries.
		const size = indexes.KeySize + indexes.RecordSize
		buf := make([]byte, o.Entries*size)
		for i := range entries {
			var h pagehash.Hash
			for b := 0; b < len(h); b += 8 {
				binary.LittleEndian.PutUint64(h[b:], rng.Uint64())
			}
			k := indexes.Key{Hash: h, Kind: uint8(rng.IntN(2))}
			rec := indexes.Record{Disk: uint16(rng.IntN(4)), Kind: k.Kind, Slot: rng.Uint64N(1 << 32), Epoch: 1, LastAccess: rng.Uint64()}
			entries[i] = indexes.Entry{Key: k, Record: rec}
			b := buf[i*size : (i+1)*size]
			indexes.EncodeKey((*[indexes.KeySize]byte)(b), k)
			indexes.EncodeRecord((*[indexes.RecordSize]byte)(b[indexes.KeySize:]), k, entries[i].Record)
			keys[i], vals[i] = b[:indexes.KeySize], b[indexes.KeySize:]
		}
		w.rounds = append(w.rounds, entries)
		w.keys = append(w.keys, keys)
		w.vals = append(w.vals, vals)
	}
	return w
}

// chunkBatches is how many batches one side runs before the other takes
// its turn on the same data.
const chunkBatches = 8

// compare runs the put rounds, then as many get rounds, on the two sides
// interleaved chunk by chunk (each chunk a few batches, the side going
// first alternating), and returns each side's throughput in entries/s:
// index put, raw put, index get, raw get. A side's throughput is the
// inverse of its median time per entry over its chunks: fine-grained
// pairing makes load from a neighbour land on both sides alike, and the
// median ignores the chunks a burst of such load hit.
func compare(ctx context.Context, o Options, index, raw Side) (ip, rp, ig, rg float64, err error) {
	w := newWorkload(o)
	sides := []Side{index, raw}
	var putTimes, getTimes [2][]float64 // seconds per entry, one per chunk
	chunk := o.Batch * chunkBatches
	pair := 0
	run := func(times *[2][]float64, n int, op func(side Side, i, j int) error) error {
		for c := 0; c < n; c += chunk {
			end := min(c+chunk, n)
			for _, s := range order(pair) {
				if err := ctx.Err(); err != nil {
					return err
				}
				start := time.Now()
				for i := c; i < end; i += o.Batch {
					if err := op(sides[s], i, min(i+o.Batch, end)); err != nil {
						return err
					}
				}
				times[s] = append(times[s], time.Since(start).Seconds()/float64(end-c))
			}
			pair++
		}
		return nil
	}
	for r := range o.Rounds {
		err := run(&putTimes, o.Entries, func(side Side, i, j int) error {
			return side.Put(w.rounds[r][i:j], w.keys[r][i:j], w.vals[r][i:j])
		})
		if err != nil {
			return 0, 0, 0, 0, fmt.Errorf("round %d put: %w", r, err)
		}
	}
	// Lookups draw random present keys from every round, in one order
	// shared by both sides.
	rng := rand.New(rand.NewPCG(o.Seed, 0x676574))
	keys := make([]indexes.Key, o.Entries)
	enc := make([][]byte, o.Entries)
	encBuf := make([]byte, o.Entries*indexes.KeySize)
	for r := range o.Rounds {
		// Both sides read their lookup keys from one contiguous array in
		// lookup order, so neither pays cache misses the other does not.
		for i := range keys {
			rr, n := rng.IntN(o.Rounds), rng.IntN(o.Entries)
			keys[i] = w.rounds[rr][n].Key
			enc[i] = encBuf[i*indexes.KeySize : (i+1)*indexes.KeySize]
			copy(enc[i], w.keys[rr][n])
		}
		err := run(&getTimes, o.Entries, func(side Side, i, j int) error {
			return side.Get(keys[i:j], enc[i:j])
		})
		if err != nil {
			return 0, 0, 0, 0, fmt.Errorf("round %d get: %w", r, err)
		}
	}
	return 1 / measure.Median(putTimes[0]), 1 / measure.Median(putTimes[1]),
		1 / measure.Median(getTimes[0]), 1 / measure.Median(getTimes[1]), nil
}

// order returns which side runs first in pair p: they take turns, so that
// neither always runs on the caches and CPU state the other left.
func order(p int) [2]int {
	if p%2 == 0 {
		return [2]int{0, 1}
	}
	return [2]int{1, 0}
}

func results(name, rawName string, o Options, ip, rp, ig, rg float64) []benchreport.Result {
	mk := func(op string, v, limit float64) benchreport.Result {
		return benchreport.Result{
			Bench:  "index/" + name + "/" + op,
			Value:  v,
			Unit:   "entries/s",
			Target: Target,
			Note:   o.note(),
		}.WithLimit(rawName, limit)
	}
	return []benchreport.Result{mk("put", ip, rp), mk("get", ig, rg)}
}

// LMDB measures the LMDB index against raw lmdb-go.
func LMDB(ctx context.Context, o Options) (res []benchreport.Result, err error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(o.Dir, "kvtier-indexbench-lmdb-")
	if err != nil {
		return nil, fmt.Errorf("index bench lmdb: %w", err)
	}
	defer func() { err = errors.Join(err, os.RemoveAll(tmp)) }()
	cfg := lmdb.DefaultConfig()
	cfg.MapSizeBytes = 8 << 30
	if !o.Sync {
		cfg.Sync = lmdb.SyncNone
	}
	index, err := NewLMDBIndexSide(ctx, tmp+"/index", cfg)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, index.Close()) }()
	raw, err := NewLMDBRawSide(tmp+"/raw", cfg)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, raw.Close()) }()
	ip, rp, ig, rg, err := compare(ctx, o, index, raw)
	if err != nil {
		return nil, fmt.Errorf("index bench lmdb: %w", err)
	}
	return results("lmdb", "raw lmdb-go", o, ip, rp, ig, rg), nil
}

// Badger measures the Badger index against raw badger.
func Badger(ctx context.Context, o Options) (res []benchreport.Result, err error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(o.Dir, "kvtier-indexbench-badger-")
	if err != nil {
		return nil, fmt.Errorf("index bench badger: %w", err)
	}
	defer func() { err = errors.Join(err, os.RemoveAll(tmp)) }()
	cfg := badger.DefaultConfig()
	cfg.Sync = o.Sync
	index, err := NewBadgerIndexSide(ctx, tmp+"/index", cfg)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, index.Close()) }()
	raw, err := NewBadgerRawSide(tmp+"/raw", cfg)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, raw.Close()) }()
	ip, rp, ig, rg, err := compare(ctx, o, index, raw)
	if err != nil {
		return nil, fmt.Errorf("index bench badger: %w", err)
	}
	return results("badger", "raw badger", o, ip, rp, ig, rg), nil
}

// indexSide drives an indexes.Index.
type indexSide struct {
	ix    indexes.Index
	dst   []indexes.Record
	found []bool
}

func (s *indexSide) Put(entries []indexes.Entry, _, _ [][]byte) error {
	return s.ix.Put(context.Background(), entries)
}

func (s *indexSide) Get(keys []indexes.Key, _ [][]byte) error {
	if cap(s.dst) < len(keys) {
		s.dst, s.found = make([]indexes.Record, len(keys)), make([]bool, len(keys))
	}
	dst, found := s.dst[:len(keys)], s.found[:len(keys)]
	if err := s.ix.Get(context.Background(), keys, dst, found); err != nil {
		return err
	}
	for i, f := range found {
		if !f {
			return fmt.Errorf("key %s missing", keys[i])
		}
	}
	return nil
}

func (s *indexSide) Close() error { return s.ix.Close() }

func quiet() indexes.Env { return indexes.Env{Logger: slog.New(slog.DiscardHandler)} }

// NewLMDBIndexSide opens an LMDB Index v1 in dir with cfg.
func NewLMDBIndexSide(ctx context.Context, dir string, cfg lmdb.Config) (Side, error) {
	cfg.Dir = dir
	ix, err := lmdb.Open(ctx, quiet(), cfg)
	if err != nil {
		return nil, err
	}
	return &indexSide{ix: ix}, nil
}

// NewBadgerIndexSide opens a Badger Index v1 in dir with cfg.
func NewBadgerIndexSide(ctx context.Context, dir string, cfg badger.Config) (Side, error) {
	cfg.Dir = dir
	ix, err := badger.Open(ctx, quiet(), cfg)
	if err != nil {
		return nil, err
	}
	return &indexSide{ix: ix}, nil
}

// rawDecode is what a user of the raw library does with a value: read the
// record's fields (the canonical layout of indexes.EncodeRecord), with no
// version or checksum check, which the raw libraries do not offer.
func rawDecode(v []byte) indexes.Record {
	_ = v[indexes.RecordSize-1]
	return indexes.Record{
		Kind:       v[1],
		Disk:       binary.LittleEndian.Uint16(v[2:]),
		Slot:       binary.LittleEndian.Uint64(v[4:]),
		Epoch:      binary.LittleEndian.Uint64(v[12:]),
		LastAccess: binary.LittleEndian.Uint64(v[20:]),
	}
}

// lmdbRaw drives lmdb-go directly, with the environment settings of the
// index: one write transaction per batch, one read transaction per lookup
// batch, values decoded into records.
type lmdbRaw struct {
	env *mdb.Env
	dbi mdb.DBI
	dst []indexes.Record
}

// NewLMDBRawSide opens a raw lmdb-go environment in dir with the settings
// the LMDB index derives from cfg.
func NewLMDBRawSide(dir string, cfg lmdb.Config) (Side, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	env, err := mdb.NewEnv()
	if err != nil {
		return nil, err
	}
	r := &lmdbRaw{env: env}
	err = errors.Join(env.SetMapSize(cfg.MapSizeBytes), env.SetMaxReaders(cfg.MaxReaders), env.SetMaxDBs(1))
	if err == nil {
		err = env.Open(dir, cfg.EnvFlags(), 0o644)
	}
	if err == nil {
		err = env.Update(func(txn *mdb.Txn) (err error) {
			r.dbi, err = txn.OpenDBI("raw", mdb.Create)
			return err
		})
	}
	if err != nil {
		_ = env.Close()
		return nil, fmt.Errorf("raw lmdb %s: %w", dir, err)
	}
	return r, nil
}

func (r *lmdbRaw) Put(_ []indexes.Entry, keys, vals [][]byte) error {
	return r.env.Update(func(txn *mdb.Txn) error {
		for i := range keys {
			if err := txn.Put(r.dbi, keys[i], vals[i], 0); err != nil {
				return err
			}
		}
		return nil
	})
}

func (r *lmdbRaw) Get(_ []indexes.Key, keys [][]byte) error {
	r.dst = slices.Grow(r.dst[:0], len(keys))[:len(keys)]
	return r.env.View(func(txn *mdb.Txn) error {
		txn.RawRead = true
		for i, k := range keys {
			v, err := txn.Get(r.dbi, k)
			if err != nil {
				return err
			}
			r.dst[i] = rawDecode(v)
		}
		return nil
	})
}

func (r *lmdbRaw) Close() error { return r.env.Close() }

// badgerRaw drives badger directly with the index's options: one
// transaction per batch, values decoded into records.
type badgerRaw struct {
	db  *badgerdb.DB
	dst []indexes.Record
}

// NewBadgerRawSide opens a raw badger database in dir with the options the
// Badger index derives from cfg.
func NewBadgerRawSide(dir string, cfg badger.Config) (Side, error) {
	db, err := badgerdb.Open(cfg.BadgerOptions(dir, slog.New(slog.DiscardHandler)))
	if err != nil {
		return nil, fmt.Errorf("raw badger %s: %w", dir, err)
	}
	return &badgerRaw{db: db}, nil
}

func (r *badgerRaw) Put(_ []indexes.Entry, keys, vals [][]byte) error {
	return r.db.Update(func(txn *badgerdb.Txn) error {
		for i := range keys {
			if err := txn.Set(keys[i], vals[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

func (r *badgerRaw) Get(_ []indexes.Key, keys [][]byte) error {
	r.dst = slices.Grow(r.dst[:0], len(keys))[:len(keys)]
	return r.db.View(func(txn *badgerdb.Txn) error {
		for i, k := range keys {
			item, err := txn.Get(k)
			if err != nil {
				return err
			}
			if err := item.Value(func(v []byte) error {
				r.dst[i] = rawDecode(v)
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
}

func (r *badgerRaw) Close() error { return r.db.Close() }

package lmdb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	mdb "github.com/PowerDNS/lmdb-go/lmdb"
	"github.com/goccy/go-yaml"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/indextest"
)

func quietEnv() indexes.Env { return indexes.Env{Logger: slog.New(slog.DiscardHandler)} }

func openAt(t testing.TB, dir string, cfg Config) *Index {
	t.Helper()
	cfg.Dir = dir
	ix, err := Open(context.Background(), quietEnv(), cfg)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	return ix
}

func TestConformance(t *testing.T) {
	for _, sync := range []string{SyncFull, SyncNone} {
		t.Run(sync, func(t *testing.T) {
			indextest.Run(t, func(t *testing.T) indexes.Index {
				cfg := DefaultConfig()
				cfg.Sync = sync
				return openAt(t, t.TempDir(), cfg)
			})
		})
	}
}

func TestDurable(t *testing.T) {
	indextest.RunDurable(t, func(t *testing.T, dir string) indexes.Index {
		return openAt(t, dir, DefaultConfig())
	})
}

func TestSecondOpenInProcessRefused(t *testing.T) {
	dir := t.TempDir()
	ix := openAt(t, dir, DefaultConfig())
	_, err := Open(context.Background(), quietEnv(), Config{Dir: dir, MapSizeBytes: 1 << 30, MaxReaders: 64, Sync: SyncFull})
	if err == nil || !strings.Contains(err.Error(), "already open in this process") {
		t.Fatalf("second open in one process: err = %v, want a refusal", err)
	}
	// The refused open must not have disturbed the first handle.
	entries := entriesFor(rand.New(rand.NewPCG(1, 1)), 10)
	if err := ix.Put(context.Background(), entries); err != nil {
		t.Fatal(err)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	ix = openAt(t, dir, DefaultConfig())
	expectPresent(t, ix, entries)
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestMapFull fills a tiny map until a batch is refused with ErrFull, then
// checks that every earlier batch is intact, the refused batch left
// nothing, and the environment accepts writes again after deletes and
// after a reopen.
func TestMapFull(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.MapSizeBytes = 1 << 20
	ix := openAt(t, dir, cfg)
	rng := rand.New(rand.NewPCG(42, 0))
	var committed [][]indexes.Entry
	var refused []indexes.Entry
	for range 1000 {
		batch := entriesFor(rng, 100)
		err := ix.Put(ctx, batch)
		if errors.Is(err, indexes.ErrFull) {
			if !strings.Contains(err.Error(), "map_size_bytes") || !strings.Contains(err.Error(), dir) {
				t.Fatalf("ErrFull message %q should name the directory and map_size_bytes", err)
			}
			refused = batch
			break
		}
		if err != nil {
			t.Fatalf("put batch %d: %v", len(committed), err)
		}
		committed = append(committed, batch)
	}
	if refused == nil {
		t.Fatalf("a 1 MiB map took %d batches of 100 entries without ErrFull", len(committed))
	}
	if len(committed) < 3 {
		t.Fatalf("only %d batches fit before ErrFull; the test needs a few", len(committed))
	}
	t.Logf("map full after %d batches of 100", len(committed))
	var all []indexes.Entry
	for _, b := range committed {
		all = append(all, b...)
	}
	check := func(ix *Index, want []indexes.Entry) {
		t.Helper()
		expectPresent(t, ix, want)
		expectAbsent(t, ix, refused)
		st, err := ix.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Entries != int64(len(want)) || st.CapacityBytes != cfg.MapSizeBytes || st.Bytes > st.CapacityBytes {
			t.Fatalf("stats = %+v, want %d entries in a %d-byte map", st, len(want), cfg.MapSizeBytes)
		}
	}
	check(ix, all)
	// Other writes still report ErrFull cleanly, and a retry is refused
	// the same way (nothing half-written in between).
	if err := ix.Put(ctx, refused); !errors.Is(err, indexes.ErrFull) {
		t.Fatalf("retry of the refused batch: err = %v, want ErrFull", err)
	}
	check(ix, all)

	// Free three quarters of the entries: LMDB reuses the freed pages. (A
	// put is admitted on a worst-case bound of the pages it dirties, one
	// leaf per key, and must leave the delete reserve: half is not
	// always enough on so small a map.)
	half := len(committed) * 3 / 4
	for _, b := range committed[:half] {
		if err := ix.Delete(ctx, keysOf(b)); err != nil {
			t.Fatalf("delete after ErrFull: %v", err)
		}
	}
	remaining := all[half*100:]
	check(ix, remaining)
	if err := ix.Put(ctx, refused); err != nil {
		t.Fatalf("put after freeing three quarters of the map: %v", err)
	}
	remaining = append(remaining, refused...)
	refused = nil
	expectPresent(t, ix, remaining)
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	ix = openAt(t, dir, cfg)
	defer ix.Close()
	expectPresent(t, ix, remaining)
}

// Modes of the re-executed test binary (the child process).
func TestConfig(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{"defaults", func(*Config) {}, ""},
		{"odd dir", func(c *Config) { c.Dir = "/x y/\"z\"\t:\n" }, ""},
		{"nometa", func(c *Config) { c.Sync = SyncNoMeta }, ""},
		{"none", func(c *Config) { c.Sync = SyncNone }, ""},
		{"bad sync", func(c *Config) { c.Sync = "sometimes" }, `sync "sometimes"`},
		{"tiny map", func(c *Config) { c.MapSizeBytes = 4096 }, "map_size_bytes 4096"},
		{"few readers", func(c *Config) { c.MaxReaders = 1 }, "max_readers 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.mutate(&c)
			err := c.Validate()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("validate = %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("validate: %v", err)
			}
			var back Config
			if err := yaml.UnmarshalWithOptions([]byte(c.String()), &back, yaml.DisallowUnknownField()); err != nil {
				t.Fatalf("decode %q: %v", c.String(), err)
			}
			if back != c {
				t.Fatalf("round trip of %q = %+v, want %+v", c.String(), back, c)
			}
		})
	}
}

func TestRegister(t *testing.T) {
	r := indexes.NewRegistry()
	if err := Register(r); err != nil {
		t.Fatal(err)
	}
	reg, err := r.Lookup(indexes.IndexV1, Name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := reg.NewConfig().(*Config)
	if *cfg != DefaultConfig() {
		t.Fatalf("NewConfig = %+v, want the defaults", *cfg)
	}
	env := quietEnv()
	env.Dir = t.TempDir()
	ix, err := reg.Factory(context.Background(), env, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(env.Dir, "data.mdb")); err != nil {
		t.Fatalf("index did not open in the env dir: %v", err)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Factory(context.Background(), env, "nope"); err == nil {
		t.Fatal("factory accepted a config of the wrong type")
	}
}

// TestCorruptRecord writes a damaged value under a key with the raw library
// (fault injection) and checks each operation's documented answer.
func TestCorruptRecord(t *testing.T) {
	ctx := context.Background()
	ix := openAt(t, t.TempDir(), DefaultConfig())
	defer ix.Close()
	entries := entriesFor(rand.New(rand.NewPCG(5, 5)), 2)
	bad, good := entries[0], entries[1]
	if err := ix.Put(ctx, entries); err != nil {
		t.Fatal(err)
	}
	if err := ix.env.Update(func(txn *mdb.Txn) error {
		var kb [indexes.KeySize]byte
		var vb [indexes.RecordSize]byte
		indexes.EncodeKey(&kb, bad.Key)
		indexes.EncodeRecord(&vb, bad.Key, bad.Record)
		vb[13] ^= 4
		return txn.Put(ix.dbi, kb[:], vb[:], 0)
	}); err != nil {
		t.Fatal(err)
	}
	keys := keysOf(entries)
	dst := make([]indexes.Record, 2)
	found := make([]bool, 2)
	err := ix.Get(ctx, keys, dst, found)
	if !errors.Is(err, indexes.ErrCorrupt) || !strings.Contains(err.Error(), bad.Key.String()) {
		t.Fatalf("get of a corrupt record: err = %v, want ErrCorrupt naming %s", err, bad.Key)
	}
	if found[0] || !found[1] || dst[1] != good.Record {
		t.Fatalf("get answered found=%v dst=%+v, want the corrupt key absent and the good one present", found, dst)
	}
	seen := 0
	err = ix.Iterate(ctx, func(e indexes.Entry) error {
		if e != good {
			t.Errorf("iterate yielded %s, want only the good entry", e.Key)
		}
		seen++
		return nil
	})
	if !errors.Is(err, indexes.ErrCorrupt) || seen != 1 {
		t.Fatalf("iterate over a corrupt record: err = %v after %d entries, want ErrCorrupt after 1", err, seen)
	}
	deleted := []bool{true}
	if err := ix.DeleteIf(ctx, []indexes.Entry{bad}, deleted); err != nil || deleted[0] {
		t.Fatalf("delete-if of a corrupt record = %v deleted=%v, want no error and not deleted", err, deleted)
	}
	if err := ix.Touch(ctx, []indexes.Key{bad.Key}, 9); err != nil {
		t.Fatalf("touch of a corrupt record: %v", err)
	}
	if err := ix.Put(ctx, []indexes.Entry{bad}); err != nil {
		t.Fatal(err)
	}
	expectPresent(t, ix, entries)
}

func entriesFor(rng *rand.Rand, n int) []indexes.Entry {
	out := make([]indexes.Entry, n)
	for i := range out {
		k := indextest.RandomKey(rng, 3)
		out[i] = indexes.Entry{Key: k, Record: indextest.RandomRecord(rng, k)}
	}
	return out
}

func keysOf(entries []indexes.Entry) []indexes.Key {
	out := make([]indexes.Key, len(entries))
	for i, e := range entries {
		out[i] = e.Key
	}
	return out
}

func expectPresent(t testing.TB, ix *Index, entries []indexes.Entry) {
	t.Helper()
	dst := make([]indexes.Record, len(entries))
	found := make([]bool, len(entries))
	if err := ix.Get(context.Background(), keysOf(entries), dst, found); err != nil {
		t.Fatalf("get: %v", err)
	}
	for i, e := range entries {
		if !found[i] || dst[i] != e.Record {
			t.Fatalf("entry %d %s: found=%v %+v, want %+v", i, e.Key, found[i], dst[i], e.Record)
		}
	}
}

func expectAbsent(t testing.TB, ix *Index, entries []indexes.Entry) {
	t.Helper()
	dst := make([]indexes.Record, len(entries))
	found := make([]bool, len(entries))
	if err := ix.Get(context.Background(), keysOf(entries), dst, found); err != nil {
		t.Fatalf("get: %v", err)
	}
	for i, e := range entries {
		if found[i] {
			t.Fatalf("entry %d %s of the refused batch is present", i, e.Key)
		}
	}
}

func TestMetrics(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	env := quietEnv()
	env.Registerer = reg
	cfg := DefaultConfig()
	cfg.Dir, cfg.MapSizeBytes = t.TempDir(), 256<<10
	ix, err := Open(ctx, env, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	rng := rand.New(rand.NewPCG(8, 8))
	for {
		err := ix.Put(ctx, entriesFor(rng, 100))
		if errors.Is(err, indexes.ErrFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	entries := entriesFor(rng, 3)
	if err := ix.Get(ctx, keysOf(entries), make([]indexes.Record, 3), make([]bool, 3)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		metric, op string
		want       float64
	}{
		{"kvtier_index_full_total", "", 1},
		{"kvtier_index_errors_total", "put", 1},
		{"kvtier_index_calls_total", "get", 1},
		{"kvtier_index_entries_total", "get", 3},
		{"kvtier_index_corrupt_records_total", "", 0},
	}
	for _, tt := range tests {
		if got := gathered(t, reg, tt.metric, tt.op); got != tt.want {
			t.Errorf("%s{op=%q} = %v, want %v", tt.metric, tt.op, got, tt.want)
		}
	}
	if puts := gathered(t, reg, "kvtier_index_calls_total", "put"); puts < 4 {
		t.Errorf("put calls = %v, want the batches before the map filled", puts)
	}
}

// gathered returns the value of the lmdb index's counter metric (with
// label op, when op is not empty) from reg.
func gathered(t *testing.T, reg *prometheus.Registry, metric, op string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != metric {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["index"] == Name && labels["op"] == op {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("metric %s{index=%q,op=%q} not gathered", metric, Name, op)
	return 0
}

// FuzzConfigString checks that String is a YAML encoding Validate and the
// strict decoder accept back unchanged, for any directory name that is
// valid UTF-8 (YAML text is UTF-8; a path that is not cannot be written in
// a config file at all).
func FuzzConfigString(f *testing.F) {
	f.Add("", int64(1<<30), 1024, SyncFull)
	f.Add("/var/lib/kvtier/index", int64(64<<10), 8, SyncNone)
	f.Add("a\"b\\c\n\t: #x", int64(1<<40), 65536, SyncNoMeta)
	f.Add("\u00e9\u2028\x7f", int64(1<<20), 100, SyncFull)
	f.Fuzz(func(t *testing.T, dir string, mapSize int64, readers int, sync string) {
		c := Config{Dir: dir, MapSizeBytes: mapSize, MaxReaders: readers, Sync: sync}
		if !utf8.ValidString(dir) || !utf8.ValidString(sync) || c.Validate() != nil {
			return
		}
		var back Config
		if err := yaml.UnmarshalWithOptions([]byte(c.String()), &back, yaml.DisallowUnknownField()); err != nil {
			t.Fatalf("decode %q: %v", c.String(), err)
		}
		if back != c {
			t.Fatalf("round trip of %q = %+v, want %+v", c.String(), back, c)
		}
	})
}

// TestOpenSmallestConfig opens the smallest valid config: every config
// Validate accepts at the low end must open and hold entries.
func TestOpenSmallestConfig(t *testing.T) {
	cfg := Config{MapSizeBytes: minMapSize, MaxReaders: minMaxReaders, Sync: SyncNone}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ix := openAt(t, t.TempDir(), cfg)
	defer ix.Close()
	entries := entriesFor(rand.New(rand.NewPCG(3, 3)), 50)
	if err := ix.Put(context.Background(), entries); err != nil {
		t.Fatal(err)
	}
	expectPresent(t, ix, entries)
}

// TestChecksFire feeds each invariant check a state that breaks it and
// requires a panic naming the key; the checks run in -tags invariants and
// race builds.
func TestChecksFire(t *testing.T) {
	ix := openAt(t, t.TempDir(), DefaultConfig())
	defer ix.Close()
	e := entriesFor(rand.New(rand.NewPCG(4, 4)), 1)[0]
	other := e
	other.Record.Slot++
	panics := func(name string, fn func()) {
		t.Helper()
		defer func() {
			r := recover()
			if r == nil || !strings.Contains(fmt.Sprint(r), "invariant") {
				t.Errorf("%s: recovered %v, want an invariant panic", name, r)
			}
		}()
		fn()
	}
	err := ix.env.Update(func(txn *mdb.Txn) error {
		var kb [indexes.KeySize]byte
		var vb [indexes.RecordSize]byte
		indexes.EncodeKey(&kb, e.Key)
		indexes.EncodeRecord(&vb, e.Key, e.Record)
		if err := txn.Put(ix.dbi, kb[:], vb[:], 0); err != nil {
			return err
		}
		panics("written", func() { ix.checkWritten(txn, []indexes.Entry{other}) })
		panics("absent", func() { ix.checkAbsent(txn, []indexes.Key{e.Key}) })
		panics("touched", func() { ix.checkTouched(txn, []indexes.Key{e.Key}, e.Record.LastAccess+1) })
		prev := []byte{2}
		panics("order", func() { ix.checkOrder(&prev, []byte{1}) })
		// And the checks pass on a state that keeps them.
		ix.checkWritten(txn, []indexes.Entry{other, e})
		ix.checkTouched(txn, []indexes.Key{e.Key}, e.Record.LastAccess)
		ix.checkOrder(&prev, []byte{3})
		return errors.New("abort the probe transaction")
	})
	if err == nil || !strings.Contains(err.Error(), "abort the probe") {
		t.Fatalf("probe transaction: %v", err)
	}
}

// TestCloseWaitsForIterate: Close waits for an iteration in flight.
func TestCloseWaitsForIterate(t *testing.T) {
	indextest.CloseWaitsForIterate(t, func(t *testing.T) indexes.Index {
		ix := openAt(t, t.TempDir(), DefaultConfig())
		t.Cleanup(func() { ix.Close() })
		return ix
	})
}

// TestPutAfterDeletesSettles: on a full map, one delete batch frees most
// pages, but LMDB reuses them only after one more commit. The next put must
// not be refused for that (a refused put commits nothing, so every later
// put would be refused too): the index settles and stores it.
func TestPutAfterDeletesSettles(t *testing.T) {
	ctx := context.Background()
	cfg := DefaultConfig()
	cfg.MapSizeBytes = 1 << 20
	ix := openAt(t, t.TempDir(), cfg)
	rng := rand.New(rand.NewPCG(7, 0))
	var all []indexes.Entry
	for {
		batch := entriesFor(rng, 100)
		err := ix.Put(ctx, batch)
		if errors.Is(err, indexes.ErrFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, batch...)
		if len(all) > 100_000 {
			t.Fatal("a 1 MiB map never filled")
		}
	}
	// Keep a quarter, delete the rest in batches (as the L3 store's GC).
	kept := len(all) / 4
	keys := make([]indexes.Key, 0, len(all))
	for _, e := range all[kept:] {
		keys = append(keys, e.Key)
	}
	for i := 0; i < len(keys); i += 20 {
		if err := ix.Delete(ctx, keys[i:min(i+20, len(keys))]); err != nil {
			t.Fatalf("delete keys %d.. of a full map: %v", i, err)
		}
	}
	for i := range 20 {
		batch := entriesFor(rng, 100)
		if err := ix.Put(ctx, batch); err != nil {
			t.Fatalf("put batch %d after deleting %d of %d entries (settles %d): %v", i, len(keys), len(all), ix.Settles(), err)
		}
		all = append(all, batch...)
	}
	if ix.Settles() == 0 {
		t.Fatalf("the first put after the deletes found room without settling: the test no longer pins the case")
	}
	expectPresent(t, ix, append(all[:kept:kept], all[len(all)-2000:]...))
}

// TestPutDeferred checks that a deferred batch is visible at once, that
// the MDB_NOSYNC it commits under is cleared again (the next Put flushes
// as configured), that Sync flushes, and that both refuse after Close.
func TestPutDeferred(t *testing.T) {
	for _, tc := range []struct {
		sync      string
		wantFlags uint // sync flags the environment keeps between calls
	}{
		{SyncFull, 0},
		{SyncNoMeta, mdb.NoMetaSync},
		{SyncNone, mdb.NoSync},
	} {
		t.Run(tc.sync, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Sync = tc.sync
			dir := t.TempDir()
			ix := openAt(t, dir, cfg)
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(7, 7))
			deferred, flushed := entriesFor(rng, 300), entriesFor(rng, 10)
			if err := ix.PutDeferred(ctx, deferred); err != nil {
				t.Fatal(err)
			}
			flags, err := ix.env.Flags()
			if err != nil {
				t.Fatal(err)
			}
			if got := flags & (mdb.NoSync | mdb.NoMetaSync); got != tc.wantFlags {
				t.Fatalf("sync flags after PutDeferred %#x, want %#x", got, tc.wantFlags)
			}
			if err := ix.Put(ctx, flushed); err != nil {
				t.Fatal(err)
			}
			if err := ix.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			all := append(deferred, flushed...)
			recs, found := make([]indexes.Record, len(all)), make([]bool, len(all))
			if err := ix.Get(ctx, keysOf(all), recs, found); err != nil {
				t.Fatal(err)
			}
			for i := range all {
				if !found[i] || recs[i] != all[i].Record {
					t.Fatalf("entry %d: found %v record %+v, want %+v", i, found[i], recs[i], all[i].Record)
				}
			}
			if err := ix.Close(); err != nil {
				t.Fatal(err)
			}
			if err := ix.PutDeferred(ctx, flushed); !errors.Is(err, indexes.ErrClosed) {
				t.Fatalf("PutDeferred after Close: %v, want ErrClosed", err)
			}
			if err := ix.Sync(ctx); !errors.Is(err, indexes.ErrClosed) {
				t.Fatalf("Sync after Close: %v, want ErrClosed", err)
			}
			ix = openAt(t, dir, cfg)
			defer ix.Close()
			if err := ix.Get(ctx, keysOf(all), recs, found); err != nil {
				t.Fatal(err)
			}
			for i := range all {
				if !found[i] {
					t.Fatalf("entry %d lost across a reopen", i)
				}
			}
		})
	}
}

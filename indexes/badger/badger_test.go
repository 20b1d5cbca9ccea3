package badger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	badgerdb "github.com/dgraph-io/badger/v4"
	"github.com/goccy/go-yaml"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/indextest"
)

func testEnv(t *testing.T) indexes.Env {
	return indexes.Env{Logger: slog.New(slog.DiscardHandler), Dir: t.TempDir()}
}

func openAt(t *testing.T, dir string, cfg Config) *Index {
	t.Helper()
	cfg.Dir = dir
	ix, err := Open(context.Background(), indexes.Env{Logger: slog.New(slog.DiscardHandler)}, cfg)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	return ix
}

func TestConformance(t *testing.T) {
	for _, sync := range []bool{true, false} {
		t.Run(map[bool]string{true: "sync", false: "nosync"}[sync], func(t *testing.T) {
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

func TestMetamorphicSyncSettings(t *testing.T) {
	on, off := DefaultConfig(), DefaultConfig()
	off.Sync = false
	for _, seed := range []uint64{1, 2, 3} {
		a := openAt(t, t.TempDir(), on)
		b := openAt(t, t.TempDir(), off)
		indextest.Metamorphic(t, seed, 400, a, b)
		if err := errors.Join(a.Close(), b.Close()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSecondOpenInUse(t *testing.T) {
	dir := t.TempDir()
	ix := openAt(t, dir, DefaultConfig())
	_, err := Open(context.Background(), testEnv(t), Config{Dir: dir, Sync: true, MemTableBytes: 64 << 20})
	if !errors.Is(err, indexes.ErrInUse) {
		t.Fatalf("second open in one process: err = %v, want ErrInUse", err)
	}
	if !strings.Contains(err.Error(), "in use by another process") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("second open: error %q should say the index is in use and name %s", err, dir)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	// Once closed, the directory opens again.
	if err := openAt(t, dir, DefaultConfig()).Close(); err != nil {
		t.Fatal(err)
	}
}

// childEnv names the directory a re-executed test binary opens.
const childEnv = "KVTIER_BADGER_INDEX_CHILD_DIR"

// TestChildOpen is the body of the child process of TestOtherProcessInUse;
// it does nothing in a normal run.
func TestChildOpen(t *testing.T) {
	dir := os.Getenv(childEnv)
	if dir == "" {
		t.Skip("child process of TestOtherProcessInUse only")
	}
	_, err := Open(context.Background(), indexes.Env{Logger: slog.New(slog.DiscardHandler)}, Config{Dir: dir, Sync: true, MemTableBytes: 64 << 20})
	if !errors.Is(err, indexes.ErrInUse) {
		t.Fatalf("open from a second process: err = %v, want ErrInUse", err)
	}
}

func TestOtherProcessInUse(t *testing.T) {
	dir := t.TempDir()
	ix := openAt(t, dir, DefaultConfig())
	defer ix.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildOpen$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child process: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "--- PASS: TestChildOpen") {
		t.Fatalf("child process did not run its check:\n%s", out)
	}
}

func TestConfig(t *testing.T) {
	valid := DefaultConfig()
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{"defaults", func(*Config) {}, ""},
		{"odd dir", func(c *Config) { c.Dir = "/tmp/a b\t\"q\"\n:x" }, ""},
		{"no sync", func(c *Config) { c.Sync = false }, ""},
		{"tiny memtable", func(c *Config) { c.MemTableBytes = 1024 }, "memtable_bytes 1024"},
		{"huge memtable", func(c *Config) { c.MemTableBytes = 2 << 30 }, "memtable_bytes"},
		{"negative cache", func(c *Config) { c.BlockCacheBytes = -1 }, "block_cache_bytes -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid
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
	env := testEnv(t)
	ix, err := reg.Factory(context.Background(), env, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(env.Dir, lockFileName)); err != nil {
		t.Fatalf("index did not open in the env dir: %v", err)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Factory(context.Background(), env, 42); err == nil {
		t.Fatal("factory accepted a config of the wrong type")
	}
	if err := Register(r); err == nil {
		t.Fatal("second registration accepted")
	}
}

// TestCorruptRecord writes a damaged value under a key with the raw library
// (fault injection) and checks each operation's documented answer.
func TestCorruptRecord(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	good := indextest.RandomKey(newRand(), 2)
	bad := indextest.RandomKey(newRand(), 2)
	bad.Hash[0] ^= 0xff
	goodRec := indexes.Record{Disk: 1, Kind: good.Kind, Slot: 2, Epoch: 3, LastAccess: 4}

	ix := openAt(t, dir, DefaultConfig())
	if err := ix.Put(ctx, []indexes.Entry{{Key: good, Record: goodRec}, {Key: bad, Record: goodRec}}); err != nil {
		t.Fatal(err)
	}
	// Flip a bit of bad's record through the raw database handle.
	if err := ix.db.Update(func(txn *badgerdb.Txn) error {
		var kb [indexes.KeySize]byte
		var vb [indexes.RecordSize]byte
		indexes.EncodeKey(&kb, bad)
		indexes.EncodeRecord(&vb, bad, goodRec)
		vb[5] ^= 1
		return txn.Set(kb[:], vb[:])
	}); err != nil {
		t.Fatal(err)
	}
	keys := []indexes.Key{bad, good}
	dst := make([]indexes.Record, 2)
	found := make([]bool, 2)
	err := ix.Get(ctx, keys, dst, found)
	if !errors.Is(err, indexes.ErrCorrupt) || !strings.Contains(err.Error(), bad.String()) {
		t.Fatalf("get of a corrupt record: err = %v, want ErrCorrupt naming %s", err, bad)
	}
	if found[0] || !found[1] || dst[1] != goodRec {
		t.Fatalf("get answered found=%v dst=%+v, want the corrupt key absent and the good one present", found, dst)
	}
	var seen int
	err = ix.Iterate(ctx, func(e indexes.Entry) error {
		if e.Key != good {
			t.Errorf("iterate yielded %s, want only the good key", e.Key)
		}
		seen++
		return nil
	})
	if !errors.Is(err, indexes.ErrCorrupt) || seen != 1 {
		t.Fatalf("iterate over a corrupt record: err = %v after %d entries, want ErrCorrupt after 1", err, seen)
	}
	deleted := []bool{true}
	if err := ix.DeleteIf(ctx, []indexes.Entry{{Key: bad, Record: goodRec}}, deleted); err != nil || deleted[0] {
		t.Fatalf("delete-if of a corrupt record = %v deleted=%v, want no error and not deleted", err, deleted)
	}
	if err := ix.Touch(ctx, []indexes.Key{bad}, 9); err != nil {
		t.Fatalf("touch of a corrupt record: %v", err)
	}
	// Get, Iterate, DeleteIf and Touch each met the corrupt record once.
	var m dto.Metric
	if err := ix.m.Corrupt.Write(&m); err != nil || m.GetCounter().GetValue() != 4 {
		t.Fatalf("corrupt-record counter = %v (%v), want 4", m.GetCounter().GetValue(), err)
	}
	if err := ix.Delete(ctx, []indexes.Key{bad}); err != nil {
		t.Fatal(err)
	}
	if err := ix.Get(ctx, keys, dst, found); err != nil || found[0] {
		t.Fatalf("after deleting the corrupt key: err=%v found=%v", err, found)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
}

func newRand() *rand.Rand { return rand.New(rand.NewPCG(7, 7)) }

// FuzzConfigString checks that String is a YAML encoding Validate and the
// strict decoder accept back unchanged, for any directory name that is
// valid UTF-8 (YAML text is UTF-8; a path that is not cannot be written in
// a config file at all).
func FuzzConfigString(f *testing.F) {
	f.Add("", true, int64(64<<20), int64(16<<20))
	f.Add("/var/lib/kvtier/badger", false, int64(1<<20), int64(0))
	f.Add("a\"b\\c\n\t: #x", true, int64(1<<30), int64(64<<30))
	f.Add("\u00e9\u2028\x7f", false, int64(3<<20), int64(12345))
	f.Fuzz(func(t *testing.T, dir string, sync bool, memtable, cache int64) {
		c := Config{Dir: dir, Sync: sync, MemTableBytes: memtable, BlockCacheBytes: cache}
		if !utf8.ValidString(dir) || c.Validate() != nil {
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

// TestBatchTooBig checks that a batch larger than one Badger transaction is
// refused whole with an error that says what to raise, and that the index
// keeps working.
func TestBatchTooBig(t *testing.T) {
	ctx := context.Background()
	cfg := DefaultConfig()
	cfg.MemTableBytes = 1 << 20 // about 1,600 entries per transaction
	ix := openAt(t, t.TempDir(), cfg)
	defer ix.Close()
	rng := newRand()
	entries := make([]indexes.Entry, int(ix.db.MaxBatchCount())+10)
	for i := range entries {
		k := indextest.RandomKey(rng, 2)
		entries[i] = indexes.Entry{Key: k, Record: indextest.RandomRecord(rng, k)}
	}
	err := ix.Put(ctx, entries)
	if err == nil || !strings.Contains(err.Error(), "memtable_bytes") || !errors.Is(err, badgerdb.ErrTxnTooBig) {
		t.Fatalf("put of %d entries: err = %v, want a transaction-too-big error naming memtable_bytes", len(entries), err)
	}
	st, err := ix.Stats(ctx)
	if err != nil || st.Entries != 0 {
		t.Fatalf("after the refused batch: stats %+v, %v; want no entries", st, err)
	}
	half := entries[:len(entries)/2]
	if err := ix.Put(ctx, half); err != nil {
		t.Fatalf("put of half the batch: %v", err)
	}
	if st, err := ix.Stats(ctx); err != nil || st.Entries != int64(len(half)) {
		t.Fatalf("stats %+v, %v; want %d entries", st, err, len(half))
	}
}

// TestOpenSmallestConfig opens the smallest valid config: every config
// Validate accepts must open.
func TestOpenSmallestConfig(t *testing.T) {
	cfg := Config{Sync: false, MemTableBytes: minMemTableBytes, BlockCacheBytes: 0}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	small, dflt := openAt(t, t.TempDir(), cfg), openAt(t, t.TempDir(), DefaultConfig())
	indextest.Metamorphic(t, 9, 200, small, dflt)
	if err := errors.Join(small.Close(), dflt.Close()); err != nil {
		t.Fatal(err)
	}
}

// TestChecksFire feeds each invariant check a state that breaks it and
// requires a panic; the checks run in -tags invariants and race builds.
func TestChecksFire(t *testing.T) {
	ix := openAt(t, t.TempDir(), DefaultConfig())
	defer ix.Close()
	rng := newRand()
	k := indextest.RandomKey(rng, 2)
	e := indexes.Entry{Key: k, Record: indextest.RandomRecord(rng, k)}
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
	txn := ix.db.NewTransaction(true)
	defer txn.Discard()
	var kb [indexes.KeySize]byte
	var vb [indexes.RecordSize]byte
	indexes.EncodeKey(&kb, e.Key)
	indexes.EncodeRecord(&vb, e.Key, e.Record)
	if err := txn.Set(kb[:], vb[:]); err != nil {
		t.Fatal(err)
	}
	panics("written", func() { ix.checkWritten(txn, []indexes.Entry{other}) })
	panics("absent", func() { ix.checkAbsent(txn, []indexes.Key{e.Key}) })
	panics("touched", func() { ix.checkTouched(txn, []indexes.Key{e.Key}, e.Record.LastAccess+1) })
	prev := []byte{2}
	panics("order", func() { ix.checkOrder(&prev, []byte{1}) })
	ix.checkWritten(txn, []indexes.Entry{other, e})
	ix.checkTouched(txn, []indexes.Key{e.Key}, e.Record.LastAccess)
	ix.checkOrder(&prev, []byte{3})
}

// TestCloseWaitsForIterate: Close waits for an iteration in flight.
func TestCloseWaitsForIterate(t *testing.T) {
	indextest.CloseWaitsForIterate(t, func(t *testing.T) indexes.Index {
		ix := openAt(t, t.TempDir(), DefaultConfig())
		t.Cleanup(func() { ix.Close() })
		return ix
	})
}

func entriesForTest(n int) []indexes.Entry {
	rng := newRand()
	out := make([]indexes.Entry, n)
	for i := range out {
		k := indextest.RandomKey(rng, 2)
		out[i] = indexes.Entry{Key: k, Record: indextest.RandomRecord(rng, k)}
	}
	return out
}

// TestStatsBytesAllocated checks that Stats reports disk space used, not
// the apparent size of Badger's sparse, preallocated log files (gigabytes).
func TestStatsBytesAllocated(t *testing.T) {
	ix := openAt(t, t.TempDir(), DefaultConfig())
	defer ix.Close()
	if err := ix.Put(context.Background(), entriesForTest(1000)); err != nil {
		t.Fatal(err)
	}
	st, err := ix.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Entries != 1000 || st.Bytes <= 0 || st.Bytes > 64<<20 {
		t.Fatalf("stats = %+v, want 1000 entries in (0, 64 MiB] of disk", st)
	}
}

package pluginhost

import (
	"context"
	"errors"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/pagehash"
)

// TestIndexKilledLosesNoAcknowledgedBatch: a badger index plugin is
// SIGKILLed while a writer streams batches; after the restart every batch
// whose Put returned nil is there, byte for byte.
func TestIndexKilledLosesNoAcknowledgedBatch(t *testing.T) {
	path, sum := pluginBinary(t, faultPkg)
	dir := t.TempDir()
	x, err := OpenIndex(context.Background(), indexes.Env{Logger: testLogger(t, nil), Dir: dir}, PluginSpec{
		Name: "fault-index", Path: path, SHA256: sum, Options: fastOptions(),
		Config: map[string]any{"sync": true},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	const seed = 6
	rng := rand.New(rand.NewPCG(seed, seed))
	var acked []indexes.Entry
	failed := 0
	pid := x.pid()
	ctx := context.Background()
	for i := range 40 {
		batch := make([]indexes.Entry, 50)
		for j := range batch {
			var h pagehash.Hash
			for k := range h {
				h[k] = byte(rng.Uint32())
			}
			batch[j] = indexes.Entry{Key: indexes.Key{Hash: h}, Record: indexes.Record{Slot: rng.Uint64(), Epoch: 1, LastAccess: uint64(i)}}
		}
		if i == 15 {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
		switch err := x.Put(ctx, batch); {
		case err == nil:
			acked = append(acked, batch...)
		case errors.Is(err, ErrDown):
			failed++
		default:
			t.Fatalf("seed %d: put %d: %v, want nil or ErrDown", seed, i, err)
		}
	}
	if failed == 0 {
		t.Logf("no put failed: the restart was faster than the writer")
	}
	waitFor(t, "index restart", 20*time.Second, func() bool { return x.up() && counter(x.m.restarts) >= 1 })
	keys := make([]indexes.Key, len(acked))
	for i, e := range acked {
		keys[i] = e.Key
	}
	recs := make([]indexes.Record, len(keys))
	found := make([]bool, len(keys))
	if err := x.Get(ctx, keys, recs, found); err != nil {
		t.Fatal(err)
	}
	for i, e := range acked {
		if !found[i] || recs[i] != e.Record {
			t.Fatalf("seed %d: acknowledged entry %s lost after the kill: found=%v record %+v want %+v", seed, e.Key, found[i], recs[i], e.Record)
		}
	}
	if counter(x.m.failures.WithLabelValues(reasonCrash)) < 1 || counter(x.m.restarts) < 1 {
		t.Fatalf("crash %v restarts %v, want both >= 1", counter(x.m.failures.WithLabelValues(reasonCrash)), counter(x.m.restarts))
	}
}

// TestIndexGarbageGetReply: an index reply of the wrong length that claims
// records is never read as found; the plugin is marked down as malformed
// and comes back.
func TestIndexGarbageGetReply(t *testing.T) {
	t.Setenv("KVTIER_FAULT_GARBAGE_INDEX_GET", "1")
	path, sum := pluginBinary(t, faultPkg)
	x, err := OpenIndex(context.Background(), indexes.Env{Logger: testLogger(t, nil), Dir: t.TempDir()}, PluginSpec{
		Name: "fault-index", Path: path, SHA256: sum, Options: fastOptions(), Config: map[string]any{"sync": false},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	keys := make([]indexes.Key, 6)
	for i := range keys {
		keys[i].Hash = pagehash.Next(pagehash.Root, []uint32{uint32(i)})
	}
	recs := make([]indexes.Record, len(keys))
	found := make([]bool, len(keys))
	if err := x.Get(context.Background(), keys, recs, found); err != nil {
		t.Fatalf("get from a garbling plugin: %v, want misses", err)
	}
	for i, f := range found {
		if f {
			t.Fatalf("key %d found (record %+v) in a malformed reply", i, recs[i])
		}
	}
	if got := counter(x.m.failures.WithLabelValues(reasonMalformed)); got != 1 {
		t.Fatalf("malformed failures = %v, want 1", got)
	}
	waitFor(t, "index restart", 20*time.Second, func() bool { return x.up() && counter(x.m.restarts) >= 1 })
	if err := x.Put(context.Background(), []indexes.Entry{{Key: keys[0], Record: indexes.Record{Slot: 1}}}); err != nil {
		t.Fatalf("put after restart: %v", err)
	}
}

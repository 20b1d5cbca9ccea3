package badger

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/pagehash"
)

const killChildEnv = "KVTIER_BADGER_KILL_CHILD_DIR"

func killCfg(dir string) Config {
	cfg := DefaultConfig()
	cfg.Dir, cfg.Sync = dir, true
	cfg.MemTableBytes = 4 << 20
	cfg.BlockCacheBytes = 1 << 20
	return cfg
}

func killEntry(i int) indexes.Entry {
	return indexes.Entry{Key: indexes.Key{Hash: pagehash.Hash{byte(i), byte(i >> 8), byte(i >> 16), 7}, Kind: 1},
		Record: indexes.Record{Slot: uint64(i), Epoch: 1 << 16}}
}

// TestKillChild is TestKilledDuringOpen's victim: it opens, writes a
// batch and closes the index in a loop until it is killed.
func TestKillChild(t *testing.T) {
	dir := os.Getenv(killChildEnv)
	if dir == "" {
		t.Skip("child process of TestKilledDuringOpen only")
	}
	for round := 0; ; round++ {
		ix, err := Open(context.Background(), indexes.Env{Logger: slog.New(slog.DiscardHandler)}, killCfg(dir))
		if err != nil {
			t.Fatalf("child open: %v", err)
		}
		es := make([]indexes.Entry, 100)
		for i := range es {
			es[i] = killEntry(1_000_000 + round*100 + i)
		}
		if err := ix.Put(context.Background(), es); err != nil {
			t.Fatalf("child put: %v", err)
		}
		if err := ix.Close(); err != nil {
			t.Fatalf("child close: %v", err)
		}
	}
}

// TestKilledDuringOpen SIGKILLs a process that opens, writes and closes
// the index in a loop (so most kills land inside Badger's Open or Close,
// dgraph-io/badger#2207 among them), at seeded random moments, and
// requires every reopen to succeed with the entries written before the
// loop started, never setting the index aside.
func TestKilledDuringOpen(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("KVTIER_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	rounds := 12
	if os.Getenv("KVTIER_SOAK") == "1" {
		rounds = 100
	}
	rng := rand.New(rand.NewPCG(seed, 2207))
	dir := t.TempDir()
	ix, err := Open(context.Background(), indexes.Env{Logger: slog.New(slog.DiscardHandler)}, killCfg(dir))
	if err != nil {
		t.Fatal(err)
	}
	base := make([]indexes.Entry, 500)
	for i := range base {
		base[i] = killEntry(i)
	}
	if err := ix.Put(context.Background(), base); err != nil {
		t.Fatal(err)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	for r := range rounds {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKillChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), killChildEnv+"="+dir)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wait := time.Duration(20+rng.IntN(400)) * time.Millisecond
		time.Sleep(wait)
		_ = cmd.Process.Signal(syscall.SIGKILL)
		err := cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("seed %d round %d: child ended before the kill: %v", seed, r, err)
		}
		ix, err := Open(context.Background(), indexes.Env{Logger: slog.New(slog.DiscardHandler)}, killCfg(dir))
		if err != nil {
			t.Fatalf("seed %d round %d (killed after %v): reopen: %v", seed, r, wait, err)
		}
		if d := ix.OpenDamage(); d != nil {
			_ = ix.Close()
			t.Fatalf("seed %d round %d (killed after %v): the index was set aside: %v", seed, r, wait, d)
		}
		keys := make([]indexes.Key, len(base))
		for i := range base {
			keys[i] = base[i].Key
		}
		recs, found := make([]indexes.Record, len(keys)), make([]bool, len(keys))
		if err := ix.Get(context.Background(), keys, recs, found); err != nil {
			t.Fatalf("seed %d round %d: get: %v", seed, r, err)
		}
		for i := range found {
			if !found[i] || recs[i].Slot != base[i].Record.Slot {
				t.Fatalf("seed %d round %d: entry %d lost after the kill", seed, r, i)
			}
		}
		if err := ix.Close(); err != nil {
			t.Fatal(err)
		}
		if mems, _ := filepath.Glob(filepath.Join(dir, "*.mem")); len(mems) > 4 {
			t.Fatalf("seed %d round %d: %d memtable files pile up", seed, r, len(mems))
		}
	}
}

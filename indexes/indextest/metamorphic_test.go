package indextest_test

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"testing"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/badger"
	"github.com/kvtier/kvtier/indexes/indextest"
	"github.com/kvtier/kvtier/indexes/lmdb"
)

var seeds = flag.Int("metamorphic.seeds", 4, "number of seeds TestLMDBVersusBadger runs (raise for a soak)")

// TestLMDBVersusBadger drives one seeded random operation stream on an LMDB
// and a Badger index (and the suite's oracle) and requires identical
// answers at every step.
func TestLMDBVersusBadger(t *testing.T) {
	steps := 1500
	if testing.Short() {
		steps = 300
	}
	env := indexes.Env{Logger: slog.New(slog.DiscardHandler)}
	for seed := uint64(1); seed <= uint64(*seeds); seed++ {
		lcfg := lmdb.DefaultConfig()
		lcfg.Dir, lcfg.Sync = t.TempDir(), lmdb.SyncNone
		a, err := lmdb.Open(context.Background(), env, lcfg)
		if err != nil {
			t.Fatal(err)
		}
		bcfg := badger.DefaultConfig()
		bcfg.Dir, bcfg.Sync = t.TempDir(), false
		b, err := badger.Open(context.Background(), env, bcfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("seed %d: %d steps", seed, steps)
		indextest.Metamorphic(t, seed, steps, a, b)
		if err := errors.Join(a.Close(), b.Close()); err != nil {
			t.Fatal(err)
		}
	}
}

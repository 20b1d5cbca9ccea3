package lmdb

import (
	"context"
	"log/slog"
	"os"
	"testing"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/indextest"
)

// damageCases is the number of damage cases: a few dozen by default, 240
// with KVTIER_SOAK=1.
func damageCases() int {
	if os.Getenv("KVTIER_SOAK") == "1" {
		return 240
	}
	return 30
}

func openForDamage(ctx context.Context, dir string) (indexes.Index, error) {
	cfg := DefaultConfig()
	cfg.Dir = dir
	cfg.MapSizeBytes = 32 << 20
	cfg.Sync = SyncNone
	return Open(ctx, indexes.Env{Logger: slog.New(slog.DiscardHandler), Dir: dir}, cfg)
}

// TestDamage damages data.mdb and lock.mdb in every way indextest.Damage
// knows, each case in a subprocess, and requires a normal exit.
func TestDamage(t *testing.T) {
	indextest.Damage(t, indextest.DamageOptions{
		Open: openForDamage, Files: []string{"data.mdb", "data.mdb", "data.mdb", "lock.mdb"},
		Cases: damageCases(), ChildTest: "TestDamageChild",
	})
}

// TestDamageChild is TestDamage's victim.
func TestDamageChild(t *testing.T) { indextest.DamageChild(t, openForDamage) }

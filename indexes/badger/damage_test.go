package badger

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
	cfg.Sync = false
	cfg.MemTableBytes = 4 << 20
	cfg.BlockCacheBytes = 1 << 20
	return Open(ctx, indexes.Env{Logger: slog.New(slog.DiscardHandler), Dir: dir}, cfg)
}

// TestDamage damages the SSTs, value log, manifest and key registry in
// every way indextest.Damage knows, each case in a subprocess, and
// requires a normal exit.
func TestDamage(t *testing.T) {
	indextest.Damage(t, indextest.DamageOptions{
		Open: openForDamage, Files: []string{"*.sst", "*.sst", "*.vlog", "MANIFEST", "KEYREGISTRY"},
		Cases: damageCases(), ChildTest: "TestDamageChild",
	})
}

// TestDamageChild is TestDamage's victim.
func TestDamageChild(t *testing.T) { indextest.DamageChild(t, openForDamage) }

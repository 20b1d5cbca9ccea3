package indextest

import (
	"context"
	"log/slog"
	"testing"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/lmdb"
)

// lossyIndex is a fault-injecting wrapper, not a stand-in: it silently
// drops the last entry of every fifth Put batch of a real index, so the
// test below can check that Metamorphic notices a misbehaving index.
type lossyIndex struct {
	indexes.Index
	puts int
}

func (l *lossyIndex) Put(ctx context.Context, entries []indexes.Entry) error {
	l.puts++
	if l.puts%5 == 0 && len(entries) > 0 {
		entries = entries[:len(entries)-1]
	}
	return l.Index.Put(ctx, entries)
}

func TestMetamorphicDetectsLoss(t *testing.T) {
	env := indexes.Env{Logger: slog.New(slog.DiscardHandler)}
	open := func() indexes.Index {
		cfg := lmdb.DefaultConfig()
		cfg.Dir, cfg.Sync = t.TempDir(), lmdb.SyncNone
		ix, err := lmdb.Open(context.Background(), env, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ix.Close() })
		return ix
	}
	err := metamorphic(7, 2000, open(), &lossyIndex{Index: open()})
	if err == nil {
		t.Fatal("metamorphic run found no difference with an index that drops entries")
	}
	t.Logf("detected as expected: %v", err)
}

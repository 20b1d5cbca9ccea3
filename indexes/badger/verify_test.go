package badger

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/pagehash"
)

// pristineTable returns the bytes of a table holding n entries.
func pristineTable(t testing.TB, n int) []byte {
	t.Helper()
	dir := t.TempDir()
	ix, err := openForDamage(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	es := make([]indexes.Entry, n)
	for i := range es {
		es[i] = indexes.Entry{Key: indexes.Key{Hash: pagehash.Hash{byte(i), byte(i >> 8), 9}}, Record: indexes.Record{Slot: uint64(i), Epoch: 1 << 16}}
	}
	if err := ix.Put(context.Background(), es); err != nil {
		t.Fatal(err)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	m, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
	if len(m) == 0 {
		t.Fatal("no table written")
	}
	b, err := os.ReadFile(m[0])
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzVerifyTable feeds verifyTable arbitrary table bytes seeded with a
// real table: it must return an error or nil, never panic (a panic inside
// Badger is recovered into an error).
func FuzzVerifyTable(f *testing.F) {
	f.Add(pristineTable(f, 50))
	f.Add([]byte{})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(dir, "000001.sst")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		_ = verifyTable(path)
	})
}

// TestVerifyTablesNamesTheFile checks that a damaged table is refused
// with indexes.ErrCorrupt naming it.
func TestVerifyTablesNamesTheFile(t *testing.T) {
	b := pristineTable(t, 50)
	dir := t.TempDir()
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(filepath.Join(dir, "000007.sst"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	err := verifyTables(dir, DefaultConfig().BadgerOptions(dir, slog.New(slog.DiscardHandler)))
	if !errors.Is(err, indexes.ErrCorrupt) || !strings.Contains(err.Error(), "000007.sst") {
		t.Fatalf("verifyTables: %v, want ErrCorrupt naming 000007.sst", err)
	}
}

package lmdb

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/pagehash"
)

// pristineDataFile returns the bytes of a data.mdb holding n entries.
func pristineDataFile(t testing.TB, n int) []byte {
	t.Helper()
	dir := t.TempDir()
	ix, err := openForDamage(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	es := make([]indexes.Entry, n)
	for i := range es {
		es[i] = indexes.Entry{Key: indexes.Key{Hash: pagehash.Hash{byte(i), byte(i >> 8), 7}}, Record: indexes.Record{Slot: uint64(i), Epoch: 1 << 16}}
	}
	if err := ix.Put(context.Background(), es); err != nil {
		t.Fatal(err)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, dataFileName))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestVerifyFile accepts healthy files of several sizes and refuses each
// structural damage with indexes.ErrCorrupt.
func TestVerifyFile(t *testing.T) {
	for _, n := range []int{0, 1, 100, 5000} {
		b := pristineDataFile(t, n)
		path := filepath.Join(t.TempDir(), dataFileName)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := VerifyFile(path); err != nil {
			t.Fatalf("%d entries: healthy file refused: %v", n, err)
		}
		if n < 100 {
			continue
		}
		cases := map[string]func([]byte) []byte{
			"truncated":     func(b []byte) []byte { return b[:len(b)-4096] },
			"meta magic":    func(b []byte) []byte { b[16] ^= 1; return b },
			"zeroed page 3": func(b []byte) []byte { clear(b[3*4096 : 4*4096]); return b },
			"short":         func(b []byte) []byte { return b[:100] },
			"older meta's transaction id": func(b []byte) []byte {
				older := 0
				if binary.LittleEndian.Uint64(b[metaTxnID:]) > binary.LittleEndian.Uint64(b[4096+metaTxnID:]) {
					older = 4096
				}
				b[older+metaTxnID+7] ^= 0x20
				return b
			},
			"last page past the end": func(b []byte) []byte {
				newer := 0
				if binary.LittleEndian.Uint64(b[metaTxnID:]) < binary.LittleEndian.Uint64(b[4096+metaTxnID:]) {
					newer = 4096
				}
				binary.LittleEndian.PutUint64(b[newer+metaLastPg:], uint64(len(b)/4096+5))
				return b
			},
		}
		if n >= 5000 {
			cases["branch separator out of its child's range"] = damageSeparator(t)
		}
		for name, damage := range cases {
			if err := os.WriteFile(path, damage(bytes.Clone(b)), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := VerifyFile(path); !errors.Is(err, indexes.ErrCorrupt) {
				t.Errorf("%d entries, %s: %v, want ErrCorrupt", n, name, err)
			}
		}
	}
}

// damageSeparator returns a damage that raises the kind byte of the second
// separator key of the first branch page of 33-byte keys: the page stays in
// order while its child's first key falls below the separator.
func damageSeparator(t *testing.T) func([]byte) []byte {
	return func(b []byte) []byte {
		for p := 2; (p+1)*4096 <= len(b); p++ {
			pg := b[p*4096 : (p+1)*4096]
			lower := int(binary.LittleEndian.Uint16(pg[12:]))
			if binary.LittleEndian.Uint16(pg[10:]) != pBranch || (lower-pageHdrSize)/2 < 3 {
				continue
			}
			ptr := int(binary.LittleEndian.Uint16(pg[pageHdrSize+2:]))
			if binary.LittleEndian.Uint16(pg[ptr+6:]) != 33 {
				continue
			}
			pg[ptr+nodeHdrSize+32]++
			return b
		}
		t.Fatal("no branch page of 33-byte keys in the pristine file")
		return nil
	}
}

// FuzzVerifyFile feeds VerifyFile arbitrary bytes seeded with real data
// files: it must return (nil or ErrCorrupt), never panic or hang.
func FuzzVerifyFile(f *testing.F) {
	f.Add(pristineDataFile(f, 0))
	f.Add(pristineDataFile(f, 300))
	f.Add([]byte{})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(dir, dataFileName)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := VerifyFile(path); err != nil && !errors.Is(err, indexes.ErrCorrupt) {
			t.Fatalf("error %v does not wrap ErrCorrupt", err)
		}
	})
}

// TestVerifyFileChurn accepts a file after many commits of puts and
// deletes: a deep tree, a free list with multi-page records (overflow
// pages in the free tree).
func TestVerifyFileChurn(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	ix, err := openForDamage(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	key := func(i int) indexes.Key {
		return indexes.Key{Hash: pagehash.Hash{byte(i), byte(i >> 8), byte(i >> 16), 3}, Kind: uint8(i % 4)}
	}
	const n = 60000
	for base := 0; base < n; base += 2000 {
		es := make([]indexes.Entry, 2000)
		for i := range es {
			es[i] = indexes.Entry{Key: key(base + i), Record: indexes.Record{Slot: uint64(base + i), Epoch: 1 << 16}}
		}
		if err := ix.Put(ctx, es); err != nil {
			t.Fatal(err)
		}
	}
	// Delete two thirds in one transaction: thousands of pages freed at
	// once make a free-list record that spills onto overflow pages.
	var del []indexes.Key
	for i := 0; i < n; i++ {
		if i%3 != 0 {
			del = append(del, key(i))
		}
	}
	if err := ix.Delete(ctx, del); err != nil {
		t.Fatal(err)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	if err := VerifyFile(filepath.Join(dir, dataFileName)); err != nil {
		t.Fatalf("healthy file after churn refused: %v", err)
	}
	ix, err = openForDamage(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if d := ix.(*Index).OpenDamage(); d != nil {
		t.Fatalf("healthy file set aside: %v", d)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
}

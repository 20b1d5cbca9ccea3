package filestore

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

func TestStoreRoundTrip(t *testing.T) {
	const seed = 24
	rng := rand.New(rand.NewPCG(seed, 0))
	s, err := Open(filepath.Join(t.TempDir(), "pages"))
	if err != nil {
		t.Fatal(err)
	}
	const pages, size = 16, 4096
	want := make([][]byte, pages)
	for i := range want {
		want[i] = make([]byte, size)
		for j := range want[i] {
			want[i][j] = byte(rng.Uint32())
		}
		if err := s.Set(fmt.Sprintf("k%d", i), want[i]); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, size)
	for i := range want {
		ok, err := s.Get(fmt.Sprintf("k%d", i), buf)
		if err != nil || !ok {
			t.Fatalf("seed %d: get k%d: ok %v err %v", seed, i, ok, err)
		}
		if !bytes.Equal(buf, want[i]) {
			t.Fatalf("seed %d: k%d read back wrong bytes", seed, i)
		}
	}
	// Overwrite replaces the whole page; no temp files stay behind.
	if err := s.Set("k0", want[1]); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Get("k0", buf); err != nil || !ok || !bytes.Equal(buf, want[1]) {
		t.Fatalf("seed %d: overwritten k0: ok %v err %v", seed, ok, err)
	}
	ents, _ := os.ReadDir(s.Dir())
	if len(ents) != pages {
		t.Fatalf("%d files in the store, want %d", len(ents), pages)
	}
	if err := s.Clear(); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Exists("k3"); err != nil || ok {
		t.Fatalf("after clear: exists %v err %v", ok, err)
	}
}

func TestStoreBadInput(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Set("a", make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		key  string
		buf  int
		ok   bool
		err  bool
	}{
		{"missing", "b", 10, false, false},
		{"present", "a", 10, true, false},
		{"wrong length", "a", 11, false, true},
		{"empty key", "", 10, false, true},
		{"long key", string(make([]byte, 101)), 10, false, true},
		{"path key", "../../etc/passwd", 10, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ok, err := s.Get(tc.key, make([]byte, tc.buf))
			if ok != tc.ok || (err != nil) != tc.err {
				t.Fatalf("get %q: ok %v err %v, want ok %v err %v", tc.key, ok, err, tc.ok, tc.err)
			}
		})
	}
}

func TestBatchExists(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "d"} {
		if err := s.Set(k, []byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		keys []string
		want int
	}{
		{[]string{"a", "b", "c", "d"}, 2},
		{[]string{"a", "b"}, 2},
		{[]string{"c", "a"}, 0},
		{nil, 0},
	}
	for _, tc := range tests {
		n, err := s.BatchExists(tc.keys)
		if err != nil || n != tc.want {
			t.Fatalf("BatchExists(%q) = %d, %v; want %d", tc.keys, n, err, tc.want)
		}
	}
}

func BenchmarkSetGet(b *testing.B) {
	s, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	page := make([]byte, 64<<10)
	buf := make([]byte, len(page))
	b.SetBytes(int64(2 * len(page)))
	for i := 0; b.Loop(); i++ {
		k := fmt.Sprintf("k%d", i%128)
		if err := s.Set(k, page); err != nil {
			b.Fatal(err)
		}
		if ok, err := s.Get(k, buf); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}

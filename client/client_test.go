package client

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/pagehash"
)

func TestPackHashes(t *testing.T) {
	hs := []pagehash.Hash{pagehash.Next(pagehash.Root, []uint32{1}), pagehash.Next(pagehash.Root, []uint32{2})}
	b := PackHashes(nil, hs)
	if len(b) != 64 || string(b[32:]) != string(hs[1][:]) {
		t.Fatalf("packed %x", b)
	}
}

func TestMapSlab(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s0")
	if err := os.WriteFile(p, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := MapSlab(&pb.SlabGeometry{Files: []*pb.SlabFile{{Id: 0, Path: p, Size: 8192}}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b, err := s.Bytes(0, 4096, 4096)
	if err != nil || len(b) != 4096 {
		t.Fatalf("%d bytes, %v", len(b), err)
	}
	b[0] = 7
	if got, _ := os.ReadFile(p); got[4096] != 7 {
		t.Fatal("a write through the mapping did not reach the file")
	}
	for _, tc := range []struct {
		slab        uint32
		off, length uint64
		want        string
	}{
		{1, 0, 1, "slab 1 of 1"},
		{0, 8192, 1, "outside"},
		{0, 4096, 4097, "outside"},
		{0, 1 << 63, 1 << 63, "outside"},
	} {
		if _, err := s.Bytes(tc.slab, tc.off, tc.length); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Bytes(%d, %d, %d): %v, want %q", tc.slab, tc.off, tc.length, err, tc.want)
		}
	}
	if _, err := MapSlab(&pb.SlabGeometry{Files: []*pb.SlabFile{{Id: 3, Path: p, Size: 8192}}}); err == nil {
		t.Fatal("a slab file out of order was mapped")
	}
	if _, err := MapSlab(&pb.SlabGeometry{Files: []*pb.SlabFile{{Id: 0, Path: p + "-missing", Size: 8192}}}); err == nil {
		t.Fatal("a missing slab file was mapped")
	}
}

func FuzzSlabBytes(f *testing.F) {
	p := filepath.Join(f.TempDir(), "s0")
	if err := os.WriteFile(p, make([]byte, 4096), 0o600); err != nil {
		f.Fatal(err)
	}
	s, err := MapSlab(&pb.SlabGeometry{Files: []*pb.SlabFile{{Id: 0, Path: p, Size: 4096}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(uint32(0), uint64(0), uint64(4096))
	f.Fuzz(func(t *testing.T, slab uint32, off, length uint64) {
		b, err := s.Bytes(slab, off, length)
		if err == nil && uint64(len(b)) != length {
			t.Fatalf("%d bytes for %d", len(b), length)
		}
	})
}

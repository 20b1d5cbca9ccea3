package slabfile

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/kvtier/kvtier/tiers"
)

func TestCreateAttachShareBytes(t *testing.T) {
	host, err := Create(t.TempDir(), "stack-a", 4096, 8192, 5000)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	g := host.Geometry()
	if len(g.Slabs) != 2 || g.Slabs[1].Size != 8192 {
		t.Fatalf("geometry %+v: want two slabs, the second rounded up to 8192 bytes", g)
	}
	peer, err := Attach(g)
	if err != nil {
		t.Fatal(err)
	}
	sp := tiers.Span{Slab: 1, Offset: 4096, Length: 100}
	w, err := host.Bytes(sp)
	if err != nil {
		t.Fatal(err)
	}
	copy(w, bytes.Repeat([]byte{0xab}, 100))
	r, err := peer.Bytes(sp)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r, w) {
		t.Fatalf("attached view does not see the creator's write")
	}
	if err := peer.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(g.Slabs[0].Path); err != nil {
		t.Fatalf("attached Close removed the creator's file: %v", err)
	}
	if err := host.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(g.Slabs[0].Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("creator Close left %s behind: %v", g.Slabs[0].Path, err)
	}
}

func TestBytesRejectsBadSpans(t *testing.T) {
	s, err := Create(t.TempDir(), "stack-a", 4096, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, sp := range []tiers.Span{
		{Slab: 1, Offset: 0, Length: 1},
		{Slab: 0, Offset: -1, Length: 1},
		{Slab: 0, Offset: 0, Length: -1},
		{Slab: 0, Offset: 4000, Length: 97},
		{Slab: 0, Offset: 1 << 62, Length: 1 << 62},
	} {
		if _, err := s.Bytes(sp); !errors.Is(err, tiers.ErrInvalid) {
			t.Errorf("span %+v: got %v, want ErrInvalid", sp, err)
		}
	}
}

func TestAttachRefusesBadGeometry(t *testing.T) {
	s, err := Create(t.TempDir(), "stack-a", 4096, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	good := s.Geometry()
	for name, mutate := range map[string]func(*tiers.SlabGeometry){
		"empty":      func(g *tiers.SlabGeometry) { g.Slabs = nil },
		"wrong id":   func(g *tiers.SlabGeometry) { g.Slabs[0].ID = 3 },
		"no path":    func(g *tiers.SlabGeometry) { g.Slabs[0].Path = "" },
		"wrong size": func(g *tiers.SlabGeometry) { g.Slabs[0].Size = 8192 },
		"missing":    func(g *tiers.SlabGeometry) { g.Slabs[0].Path += ".gone" },
	} {
		g := good
		g.Slabs = append([]tiers.SlabFile(nil), good.Slabs...)
		mutate(&g)
		if a, err := Attach(g); err == nil {
			a.Close()
			t.Errorf("%s: Attach accepted %+v", name, g)
		}
	}
}

package slabfile

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l2hugetlb"
)

// TestOpenIsAttachable: a second mapping made by l2hugetlb.Attach (what a
// plugin does) sees the creator's bytes, and Close removes the files.
func TestOpenIsAttachable(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, nil, t.TempDir(), "stack-a", 1<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	g := s.Geometry()
	if g.Backing != l2hugetlb.BackingShm || len(g.Slabs) != 1 || g.Slabs[0].Size < 1<<20 {
		t.Fatalf("geometry %+v", g)
	}
	peer, err := l2hugetlb.Attach(ctx, nil, g)
	if err != nil {
		t.Fatal(err)
	}
	sp := tiers.Span{Offset: 4096, Length: 100}
	w, _ := s.Bytes(sp)
	copy(w, bytes.Repeat([]byte{0xcd}, 100))
	r, err := peer.Bytes(sp)
	if err != nil || !bytes.Equal(r, w) {
		t.Fatalf("attached view: %v", err)
	}
	if err := peer.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(g.Slabs[0].Path); !os.IsNotExist(err) {
		t.Fatalf("slab file left behind: %v", err)
	}
}

package l2bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvtier/kvtier/tiers/l2hugetlb/hugetest"
)

// TestGatherScatterRoundTrip checks the kernels move the right bytes:
// gathering every page then scattering back restores the layer-first
// buffer, and page p's gathered bytes are its layers' slices in order.
// Small slices take internal/memcopy's copy path, large ones its streaming
// path; the per-slice copy kernels are checked the same way.
func TestGatherScatterRoundTrip(t *testing.T) {
	geometries := []struct{ layers, pages, slice int }{
		{5, 7, 24},
		{3, 4, 4096},
		{6, 5, 20_000 + 3},
	}
	kernels := []struct {
		name            string
		gather, scatter PageMover
	}{
		{"memcopy", Gather, Scatter},
		{"copy", GatherCopy, ScatterCopy},
	}
	for _, g := range geometries {
		for _, k := range kernels {
			t.Run(fmt.Sprintf("%s/%dx%dx%d", k.name, g.layers, g.pages, g.slice), func(t *testing.T) {
				layers, pages, slice := g.layers, g.pages, g.slice
				src := make([]byte, layers*pages*slice)
				for i := range src {
					src[i] = byte(i*13 + i>>8 + 1)
				}
				dst := make([]byte, len(src))
				if n := GatherAllWith(k.gather, dst, src, layers, pages, int64(slice)); n != int64(len(src)) {
					t.Fatalf("gather moved %d bytes, want %d", n, len(src))
				}
				for p := 0; p < pages; p++ {
					for l := 0; l < layers; l++ {
						for i := 0; i < slice; i++ {
							got := dst[(p*layers+l)*slice+i]
							want := src[(l*pages+p)*slice+i]
							if got != want {
								t.Fatalf("page %d layer %d byte %d: %d, want %d", p, l, i, got, want)
							}
						}
					}
				}
				back := make([]byte, len(src))
				if n := ScatterAllWith(k.scatter, back, dst, layers, pages, int64(slice)); n != int64(len(src)) {
					t.Fatalf("scatter moved %d bytes, want %d", n, len(src))
				}
				for i := range src {
					if back[i] != src[i] {
						t.Fatalf("scatter byte %d: %d, want %d", i, back[i], src[i])
					}
				}
			})
		}
	}
}

// TestChurnKeepsLiveCount checks the allocator churn holds its live count
// and stays consistent.
func TestChurnKeepsLiveCount(t *testing.T) {
	c, err := NewChurn(200, 8, 7)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000; i++ {
		if err := c.Step(); err != nil {
			t.Fatalf("step %d (seed 7): %v", i, err)
		}
	}
	if st := c.A.Stats(); st.Objects != 200 || st.FreePages[0] != 400 {
		t.Fatalf("after churn: %d objects, %d free pages; want 200 and 400", st.Objects, st.FreePages[0])
	}
	if err := c.A.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestRunSmall runs every measurement at tiny sizes and checks each result
// is positive and carries its reference.
func TestRunSmall(t *testing.T) {
	o := DefaultOptions()
	o.CopyBytes, o.ChunkBytes = 4<<20, 1<<20
	o.Layers, o.SliceBytes, o.GatherPages = 4, 4<<10, 16
	// Small enough for builds with invariant checks after every allocator
	// operation (make test) and the race detector.
	o.LiveObjects, o.ObjectPages, o.DigestPages = 100, 8, 2_000
	o.MinTime = 5 * time.Millisecond
	if b := hugetest.Setup(t, o.HugePages()); b.Kind == hugetest.BackingHugetlbfs {
		o.HugeDir = b.Dir
	} else {
		o.ShmDir = b.Dir
	}
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 11 {
		t.Fatalf("%d results, want 11: %+v", len(res), res)
	}
	for _, r := range res {
		if r.Value <= 0 {
			t.Errorf("%s: value %v", r.Bench, r.Value)
		}
		if r.Bench != "l2/copy-go-slices" && (r.Limit <= 0 || r.Ratio <= 0) {
			t.Errorf("%s: limit %v ratio %v, want a measured reference", r.Bench, r.Limit, r.Ratio)
		}
	}
}

func BenchmarkCopyPages(b *testing.B) {
	o := DefaultOptions()
	src := make([]byte, o.CopyBytes)
	for i := range src {
		src[i] = byte(i)
	}
	goDst := make([]byte, o.CopyBytes)
	copy(goDst, src) // fault the pages in before timing
	dsts := map[string][]byte{"go-slice": goDst}
	anon, free, err := AnonMapping(o.CopyBytes)
	if err != nil {
		b.Fatal(err)
	}
	defer free()
	dsts["anon-mmap"] = anon
	if hb := hugetest.Setup(b, o.HugePages()); hb.Kind == hugetest.BackingHugetlbfs {
		o.HugeDir = hb.Dir
	} else {
		o.ShmDir = hb.Dir
	}
	slab, err := OpenSlab(context.Background(), o)
	if err != nil {
		b.Fatal(err)
	}
	defer slab.Close()
	whole, _ := slab.Bytes(slabSpan(slab))
	dsts["slab-"+slab.Geometry().Backing] = whole[:o.CopyBytes]
	for _, name := range []string{"go-slice", "anon-mmap", "slab-" + slab.Geometry().Backing} {
		dst := dsts[name]
		b.Run(name, func(b *testing.B) {
			b.SetBytes(o.CopyBytes)
			for b.Loop() {
				CopyPages(dst, src, o.ChunkBytes)
			}
		})
	}
}

func BenchmarkGatherScatter(b *testing.B) {
	o := DefaultOptions()
	n := int64(o.Layers) * o.SliceBytes * int64(o.GatherPages)
	layerFirst := make([]byte, n)
	pages := make([]byte, n)
	for i := range layerFirst {
		layerFirst[i] = byte(i)
	}
	copy(pages, layerFirst) // fault the pages in before timing
	b.Run("one-copy", func(b *testing.B) {
		b.SetBytes(n)
		for b.Loop() {
			copy(pages, layerFirst)
		}
	})
	for _, k := range []struct {
		name string
		all  func(dst, src []byte, layers, pages int, slice int64) int64
		dst  []byte
		src  []byte
	}{
		{"gather", GatherAll, pages, layerFirst},
		{"scatter", ScatterAll, layerFirst, pages},
		{"gather-copy", func(d, s []byte, l, p int, sl int64) int64 { return GatherAllWith(GatherCopy, d, s, l, p, sl) }, pages, layerFirst},
		{"scatter-copy", func(d, s []byte, l, p int, sl int64) int64 { return ScatterAllWith(ScatterCopy, d, s, l, p, sl) }, layerFirst, pages},
	} {
		b.Run(k.name, func(b *testing.B) {
			b.SetBytes(n)
			for b.Loop() {
				k.all(k.dst, k.src, o.Layers, o.GatherPages, o.SliceBytes)
			}
		})
	}
}

func BenchmarkReserveRelease(b *testing.B) {
	for _, live := range []int{0, 100_000} {
		b.Run(map[int]string{0: "empty", 100_000: "live100k"}[live], func(b *testing.B) {
			c, err := NewChurn(live, 64, 1)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if err := c.Step(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDigest500k(b *testing.B) {
	a, err := NewDigestState(500_000, 1)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		a.Digest()
	}
}

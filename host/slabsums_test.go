package host

import (
	"math/rand/v2"
	"testing"

	"github.com/kvtier/kvtier/host/placement"
	"github.com/kvtier/kvtier/tiers"
)

// TestSlabSumsPageOf: pageOf inverts placement.Layout.Span for every page
// of every kind of 200 seeded random layouts, refuses spans that are not
// one whole page of the kind, and a sum is kept, read and forgotten per
// page without touching its neighbours.
func TestSlabSumsPageOf(t *testing.T) {
	layouts, pages := 0, int64(0)
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 27))
		var slabs []tiers.SlabFile
		for i := range 1 + rng.IntN(3) {
			slabs = append(slabs, tiers.SlabFile{ID: tiers.SlabID(i), Size: int64(1+rng.IntN(64)) << 12})
		}
		var pay tiers.PayloadGeometry
		for k := range 1 + rng.IntN(3) {
			pay.Kinds = append(pay.Kinds, tiers.PayloadSpec{Name: string(rune('a' + k)), PageBytes: int64(1+rng.IntN(4)) << 10})
		}
		lay, err := placement.PlanLayout(slabs, pay, int64(1)<<rng.IntN(13))
		if err != nil {
			continue // too small for a page of every kind
		}
		s := newSlabSums(lay)
		layouts++
		for k, kl := range lay.Kinds {
			kind := tiers.PayloadKind(k)
			for p := range kl.Pages() {
				sp, err := lay.Span(kind, placement.Range{Kind: uint8(k), Start: p, Pages: 1})
				if err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				got, ok := s.pageOf(kind, sp)
				if !ok || got != (slabPage{kind, p}) {
					t.Fatalf("seed %d layout %s: span %+v of kind %d page %d maps to %+v %t", seed, lay, sp, k, p, got, ok)
				}
				for _, bad := range []tiers.Span{
					{Slab: sp.Slab, Offset: sp.Offset + 1, Length: sp.Length},
					{Slab: sp.Slab, Offset: sp.Offset, Length: sp.Length * 2},
					{Slab: sp.Slab + 7, Offset: sp.Offset, Length: sp.Length},
				} {
					if got, ok := s.pageOf(kind, bad); ok {
						t.Fatalf("seed %d: span %+v is not a page of kind %d, mapped to %+v", seed, bad, k, got)
					}
				}
				s.set(got, uint32(p)*31+uint32(k))
				pages++
			}
		}
		for k, kl := range lay.Kinds {
			for p := range kl.Pages() {
				pg := slabPage{tiers.PayloadKind(k), p}
				if v, ok := s.get(pg); !ok || v != uint32(p)*31+uint32(k) {
					t.Fatalf("seed %d: page %+v sum %d %t", seed, pg, v, ok)
				}
				if p%3 == 0 {
					s.forget(pg)
				}
			}
			for p := range kl.Pages() {
				_, ok := s.get(slabPage{tiers.PayloadKind(k), p})
				if ok != (p%3 != 0) {
					t.Fatalf("seed %d: kind %d page %d has a sum %t after forgetting every third", seed, k, p, ok)
				}
			}
		}
	}
	if layouts < 150 {
		t.Fatalf("only %d of 200 seeds made a layout (%d pages)", layouts, pages)
	}
	t.Logf("%d layouts, %d pages", layouts, pages)
}

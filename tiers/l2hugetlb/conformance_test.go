package l2hugetlb_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l2hugetlb"
	"github.com/kvtier/kvtier/tiers/memstore"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// TestStoreConformanceOverSlab runs the Store v1 conformance suite with a
// real store (tiers/memstore) reading and writing through an l2hugetlb
// slab instead of the suite's heap slab: the same operations must pass on
// both, on each backing.
func TestStoreConformanceOverSlab(t *testing.T) {
	g := tiers.PayloadGeometry{PageTokens: 16, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: 20000}, {Name: "idx", PageBytes: 3000}}}
	need := quantity.Size(2 * tiertest.SlabPages * g.Kinds[0].PageBytes)
	for _, bc := range backings(t, 4) {
		t.Run(bc.name, func(t *testing.T) {
			n := 0
			tiertest.RunStore(t, tiertest.StoreHarness{
				Payload: g,
				Open: func(t *testing.T) (tiers.Store, tiers.Slab) {
					n++
					cfg := bc.cfg(need, l2hugetlb.DefaultMaxSlab)
					cfg.Name = fmt.Sprintf("conf%d", n)
					env := tiers.Env{Logger: slog.New(slog.DiscardHandler), Payload: g, WorldSize: 1, StackID: "conformance"}
					slab, err := l2hugetlb.Open(context.Background(), env, cfg)
					if err != nil {
						t.Fatal(err)
					}
					env.Slab = slab
					st, err := memstore.Open(env, memstore.DefaultConfig())
					if err != nil {
						slab.Close()
						t.Fatal(err)
					}
					t.Cleanup(func() {
						st.Close()
						if err := slab.Close(); err != nil {
							t.Errorf("close slab: %v", err)
						}
					})
					return st, slab
				},
			})
		})
	}
}

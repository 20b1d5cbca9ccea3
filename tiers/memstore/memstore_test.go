package memstore_test

import (
	"log/slog"
	"testing"

	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/memstore"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

func geometry() tiers.PayloadGeometry {
	return tiers.PayloadGeometry{PageTokens: 64, Kinds: []tiers.PayloadSpec{
		{Name: "kv", PageBytes: 12*1024 + 40},
		{Name: "index", PageBytes: 1000},
	}}
}

func TestConformance(t *testing.T) {
	const capPages = 40
	g := geometry()
	for _, tc := range []struct {
		name     string
		capacity int64
		capPages int
	}{
		{"roomy", 1 << 30, 0},
		{"bounded", capPages * g.Kinds[0].PageBytes, capPages},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tiertest.RunStore(t, tiertest.StoreHarness{
				Payload:       g,
				CapacityPages: tc.capPages,
				Open: func(t *testing.T) (tiers.Store, tiers.Slab) {
					slab := tiertest.NewHeapSlab(2 * tiertest.SlabPages * g.Kinds[0].PageBytes)
					st, err := memstore.Open(tiers.Env{
						Logger: slog.New(slog.DiscardHandler), Payload: g, WorldSize: 1, Slab: slab,
					}, memstore.Config{Capacity: quantity.Size(tc.capacity)})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { st.Close() })
					return st, slab
				},
			})
		})
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []quantity.Size{0, -1} {
		cfg := memstore.Config{Capacity: c}
		if err := cfg.Validate(); err == nil {
			t.Errorf("capacity %d: no error", c)
		}
	}
	env := tiers.Env{Logger: slog.New(slog.DiscardHandler), Payload: geometry(), WorldSize: 1}
	if _, err := memstore.Open(env, memstore.DefaultConfig()); err == nil {
		t.Error("open without a slab: no error")
	}
}

func TestRegister(t *testing.T) {
	r := tiers.NewRegistry()
	if err := memstore.Register(r); err != nil {
		t.Fatal(err)
	}
	if err := memstore.Register(r); err == nil {
		t.Fatal("second registration of memstore: no error")
	}
	cfg, err := r.NewConfig(tiers.StoreV1, memstore.Name)
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := cfg.(*memstore.Config); !ok || c.Capacity != memstore.DefaultCapacity {
		t.Fatalf("NewConfig = %#v, want defaulted *memstore.Config", cfg)
	}
}

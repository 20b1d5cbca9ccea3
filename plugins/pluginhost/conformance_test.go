package pluginhost

import (
	"context"
	"testing"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/indextest"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// TestStoreConformance runs the Store v1 suite, unchanged, against the
// example memstore plugin binary.
func TestStoreConformance(t *testing.T) {
	path, sum := pluginBinary(t, "plugins/examples/memstore")
	payload := testPayload()
	slot := int64(12 << 10)
	const capacityPages = 48
	tiertest.RunStore(t, tiertest.StoreHarness{
		Payload:       payload,
		CapacityPages: capacityPages,
		Open: func(t *testing.T) (tiers.Store, tiers.Slab) {
			slab := newSlab(t, 2*tiertest.SlabPages*slot)
			st, err := OpenStore(context.Background(), storeEnv(t, slab, nil), PluginSpec{
				Name: "conformance", Path: path, SHA256: sum,
				Config:  map[string]any{"capacity": capacityPages * slot},
				Options: fastOptions(),
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st, slab
		},
	})
}

// TestIndexConformance runs the Index v1 suite, unchanged, against the
// example badger plugin binary.
func TestIndexConformance(t *testing.T) {
	path, sum := pluginBinary(t, "plugins/examples/badger")
	open := func(t *testing.T, dir string) indexes.Index {
		x, err := OpenIndex(context.Background(), indexes.Env{Logger: testLogger(t, nil), Dir: dir}, PluginSpec{
			Name: "conformance", Path: path, SHA256: sum,
			Config:  map[string]any{"sync": false, "block_cache_bytes": 1 << 20},
			Options: fastOptions(),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { x.Close() })
		return x
	}
	t.Run("Run", func(t *testing.T) {
		indextest.Run(t, func(t *testing.T) indexes.Index { return open(t, t.TempDir()) })
	})
	t.Run("Durable", func(t *testing.T) {
		indextest.RunDurable(t, func(t *testing.T, dir string) indexes.Index {
			if dir == "" {
				dir = t.TempDir()
			}
			return open(t, dir)
		})
	})
}

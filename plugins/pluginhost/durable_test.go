package pluginhost

import (
	"context"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// l3diskConfig is a small l3disk plugin config under dir: no power-loss
// probe, a few hundred slots.
func l3diskConfig(dir string) map[string]any {
	return map[string]any{
		"disks":      []any{map[string]any{"dir": filepath.Join(dir, "disk0"), "budget": "16MiB"}},
		"index_dir":  filepath.Join(dir, "index"),
		"plp_probes": 0,
	}
}

// TestL3DiskPluginConformance runs the Store v1 suite, unchanged and with
// its durability subtest, against the l3disk example plugin: a store that
// keeps its pages across a restart.
func TestL3DiskPluginConformance(t *testing.T) {
	path, sum := pluginBinary(t, "plugins/examples/l3disk")
	var mu sync.Mutex
	dirs := map[string]string{} // test name -> data directory, for Reopen
	open := func(t *testing.T, cold tiers.ColdStart) (tiers.Store, tiers.Slab) {
		mu.Lock()
		dir, ok := dirs[t.Name()]
		if !ok {
			dir = t.TempDir()
			dirs[t.Name()] = dir
		}
		mu.Unlock()
		slab := newSlab(t, 2*tiertest.SlabPages*slot)
		env := storeEnv(t, slab, nil)
		env.ColdStart = cold
		st, err := OpenStore(context.Background(), env, PluginSpec{
			Name: "l3disk", Path: path, SHA256: sum, Config: l3diskConfig(dir), Options: fastOptions(),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st, slab
	}
	tiertest.RunStore(t, tiertest.StoreHarness{
		Payload: testPayload(),
		Open:    func(t *testing.T) (tiers.Store, tiers.Slab) { return open(t, tiers.ColdStartClear) },
		Reopen:  func(t *testing.T) (tiers.Store, tiers.Slab) { return open(t, tiers.ColdStartLoad) },
	})
}

// TestL3DiskKilledKeepsDurablePages: the l3disk plugin is SIGKILLed while
// batches stream in; after the supervisor restarts it (cold start "load"),
// every page acknowledged durable before the kill reads back byte-exact.
// Pages not acknowledged durable may be there or not; none reads wrong.
func TestL3DiskKilledKeepsDurablePages(t *testing.T) {
	path, sum := pluginBinary(t, "plugins/examples/l3disk")
	slab := newSlab(t, 256*slot)
	st, err := OpenStore(context.Background(), storeEnv(t, slab, nil), PluginSpec{
		Name: "l3disk-kill", Path: path, SHA256: sum, Config: l3diskConfig(t.TempDir()), Options: fastOptions(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h := &harness{t: t, store: st, slab: slab, rng: newRandFor(7), seed: 7, acks: map[tiers.BatchID][]tiers.Ack{}}
	var all []testPage
	durable := map[tiers.Key]bool{}
	type sent struct {
		id    tiers.BatchID
		pages []testPage
	}
	var batches []sent
	pid := st.PID()
	for i := range 16 {
		ps := h.pages(8)
		// Each batch has its own slots: a span is reused only after its
		// item's gathered ack, which the drain below waits for.
		id := h.put((i%8)*8, ps)
		batches = append(batches, sent{id, ps})
		all = append(all, ps...)
		if i == 9 {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
		h.drain(map[tiers.BatchID]int{id: 8}, 20*time.Second)
	}
	for _, b := range batches {
		for _, a := range h.acks[b.id] {
			if a.Stage == tiers.AckDurable {
				durable[b.pages[a.Index].key] = true
			}
		}
	}
	// Batches 0-8 were drained before the kill, so at least their 72 pages
	// are durable; batch 9 was in flight in the store when it died.
	if len(durable) < 72 {
		t.Fatalf("only %d pages acknowledged durable, want at least the 72 drained before the kill", len(durable))
	}
	t.Logf("%d of %d pages acknowledged durable", len(durable), len(all))
	waitFor(t, "restart", 30*time.Second, h.restarted)
	after := h.pages(8)
	id := h.put(0, after)
	h.drain(map[tiers.BatchID]int{id: 8}, 20*time.Second)
	if !h.durable(id) {
		t.Fatalf("put after the restart not durable: %v", h.acks[id])
	}
	for _, p := range after {
		durable[p.key] = true
	}
	all = append(all, after...)
	for i := 0; i < len(all); i += 32 {
		chunk := all[i:min(i+32, len(all))]
		_, res := h.get(64, chunk) // checks that every hit is exact
		for j, p := range chunk {
			if durable[p.key] && res[j] != nil {
				t.Fatalf("page %s acknowledged durable before the kill is lost after the restart: %v", p.key, res[j])
			}
		}
	}
}

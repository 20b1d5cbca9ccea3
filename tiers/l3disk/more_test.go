package l3disk

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/lmdb"
	"github.com/kvtier/kvtier/registry"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs/errorfs"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// TestIndexFull: when the LMDB map fills, puts fail with tiers.ErrFull
// (wrapping indexes.ErrFull), their slots are freed, what was stored
// stays readable, and deleting pages makes room again.
func TestIndexFull(t *testing.T) {
	r := newRig(t, indexOpener{"lmdb-tiny", func(t testing.TB, dir string) indexes.Index {
		cfg := lmdb.DefaultConfig()
		cfg.Dir, cfg.MapSizeBytes, cfg.Sync = dir, 64<<10, lmdb.SyncNone
		ix, err := lmdb.Open(context.Background(), indexes.Env{Logger: testLogger(t), Dir: dir}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return ix
	}}, 2048)
	r.geom = tiers.PayloadGeometry{PageTokens: 1, Kinds: []tiers.PayloadSpec{{Name: "tiny", PageBytes: 100}}}
	r.slab = tiertest.NewHeapSlab(64 * 100)
	r.open(tiers.ColdStartClear)
	var stored []testPage
	full := false
	for b := 0; b < 60 && !full; b++ {
		pages := makePages(uint64(100+b), 50, 0, r.geom)
		for i, err := range r.put(pages, 0) {
			switch {
			case err == nil:
				stored = append(stored, pages[i])
			case errors.Is(err, tiers.ErrFull) && errors.Is(err, indexes.ErrFull):
				full = true
			default:
				t.Fatalf("put: %v, want success or ErrFull", err)
			}
		}
	}
	if !full {
		t.Fatalf("index never filled after %d pages", len(stored))
	}
	r.checkConsistent()
	for i := 0; i < len(stored); i += 50 {
		if h := countHits(r.get(stored[i:min(i+50, len(stored))], 0)); h != min(50, len(stored)-i) {
			t.Fatalf("stored pages lost after the index filled: %d hits", h)
		}
	}
	keys := make([]tiers.Key, 0, len(stored))
	for _, p := range stored[:len(stored)/2] {
		keys = append(keys, p.key)
	}
	// NB: LMDB is copy-on-write: a delete needs free pages too, so on a
	// map filled to its last page (as here) every delete is refused with
	// ErrFull (indexes/lmdb keeps no headroom for deletes). The store must
	// then keep the slot (its entry still names it) and stay consistent.
	failed := 0
	refused := make([]bool, len(keys))
	for i, k := range keys {
		err := r.store.Delete(context.Background(), []tiers.Key{k})
		if err != nil && !errors.Is(err, indexes.ErrFull) {
			t.Fatalf("delete after full: %v, want success or indexes.ErrFull", err)
		}
		if err != nil {
			failed++
			refused[i] = true
		}
	}
	t.Logf("%d stored; %d of %d single-key deletes refused with ErrFull", len(stored), failed, len(keys))
	r.checkConsistent()
	res := r.get(stored[:len(keys)], 0)
	for i, err := range res {
		if refused[i] && err != nil {
			t.Fatalf("page %d lost although its delete was refused: %v", i, err)
		}
		if !refused[i] && err == nil {
			t.Fatalf("page %d still hits after its delete succeeded", i)
		}
	}
}

// TestOpenFaults: an I/O error while creating the slab files fails Open
// with the path in the message, and a later Open succeeds.
func TestOpenFaults(t *testing.T) {
	r := newRig(t, testIndexes()[0], 8)
	efs := errorfs.Wrap(diskfs.OS{}, rule(errorfs.OpWrite, "-k1.slab", 0, 1, errorfs.Fault{Kind: errorfs.Fail, Err: unix.ENOSPC}))
	r.fs = efs
	r.index = r.ixOpen.open(t, r.ixDir)
	t.Cleanup(r.close)
	_, err := OpenFS(context.Background(), r.env(tiers.ColdStartClear), r.cfg, efs)
	if !errors.Is(err, unix.ENOSPC) || !strings.Contains(err.Error(), "-k1.slab") {
		t.Fatalf("open with ENOSPC on preallocation: %v", err)
	}
	st, err := OpenFS(context.Background(), r.env(tiers.ColdStartClear), r.cfg, efs)
	if err != nil {
		t.Fatalf("open after the fault: %v", err)
	}
	r.store = st
	pages := makePages(1, 4, 1, r.geom)
	r.put(pages, 0)
	if h := countHits(r.get(pages, 8)); h != 4 {
		t.Fatalf("%d of 4 hit", h)
	}
}

func TestRegisterAndMetrics(t *testing.T) {
	reg := tiers.NewRegistry()
	if err := Register(reg); err != nil {
		t.Fatal(err)
	}
	if err := Register(reg); !errors.Is(err, registry.ErrDuplicate) {
		t.Fatalf("second register: %v", err)
	}
	cfg, err := reg.NewConfig(tiers.StoreV1, Name)
	if err != nil {
		t.Fatal(err)
	}
	c, ok := cfg.(*Config)
	if !ok || c.Depth != DefaultConfig().Depth || c.GCStart != 0.90 || c.GCStop != 0.85 {
		t.Fatalf("NewConfig = %#v", cfg)
	}
	r := newRig(t, testIndexes()[1], 8)
	r.index = r.ixOpen.open(t, r.ixDir)
	t.Cleanup(r.close)
	c.Disks, c.Slots, c.PLPProbes = r.cfg.Disks, 8, 0
	env := r.env(tiers.ColdStartClear)
	promReg := prometheus.NewPedanticRegistry()
	env.Registerer = promReg
	rr, _ := reg.Stores.Lookup(tiers.StoreV1, Name)
	if _, err := rr.Factory(context.Background(), env, "not a config"); !errors.Is(err, tiers.ErrInvalid) {
		t.Fatalf("factory with a bad config type: %v", err)
	}
	st, err := rr.Factory(context.Background(), env, c)
	if err != nil {
		t.Fatal(err)
	}
	r.store = st.(*Store)
	pages := makePages(5, 3, 0, r.geom)
	r.put(pages, 0)
	r.get(pages, 4)
	mfs, err := promReg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			got[mf.GetName()] += v
		}
	}
	for name, want := range map[string]float64{
		"kvtier_l3_put_durable_total": 3, "kvtier_l3_get_hits_total": 3,
		"kvtier_l3_slots_used": 3, "kvtier_l3_slots_total": 16, "kvtier_l3_slab_read_only": 0,
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v (all: %v)", name, got[name], want, got)
		}
	}
}

// TestRePutAfterDroppedEntry: when a page's index entry is gone but the
// writer still holds its slot (a reader dropped a corrupt slot and its
// notice is in flight), a second put of the page writes it again instead
// of acking durable over a missing entry.
func TestRePutAfterDroppedEntry(t *testing.T) {
	r := newRig(t, testIndexes()[1], 8)
	r.open(tiers.ColdStartClear)
	pages := makePages(7, 2, 0, r.geom)
	r.put(pages, 0)
	if err := r.index.Delete(context.Background(), []indexes.Key{pages[0].key.IndexKey()}); err != nil {
		t.Fatal(err)
	}
	for i, err := range r.put(pages, 0) {
		if err != nil {
			t.Fatalf("re-put %d: %v", i, err)
		}
	}
	if h := countHits(r.get(pages, 4)); h != 2 {
		t.Fatalf("%d of 2 hit after the re-put", h)
	}
	r.checkConsistent()
}

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
// (wrapping indexes.ErrFull), their slots are freed, what was stored stays
// readable, every delete still succeeds (the index keeps a reserve for
// them: LMDB's copy-on-write makes a delete need free pages too), the
// deleted pages miss, the others still hit, and puts succeed again.
func TestIndexFull(t *testing.T) {
	r := newRig(t, indexOpener{"lmdb-tiny", func(t testing.TB, dir string) indexes.Index {
		cfg := lmdb.DefaultConfig()
		cfg.Dir, cfg.MapSizeBytes, cfg.Sync = dir, 1<<20, lmdb.SyncNone
		ix, err := lmdb.Open(context.Background(), indexes.Env{Logger: testLogger(t), Dir: dir}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return ix
	}}, 16384)
	r.geom = tiers.PayloadGeometry{PageTokens: 1, Kinds: []tiers.PayloadSpec{{Name: "tiny", PageBytes: 100}}}
	r.slab = tiertest.NewHeapSlab(64 * 100)
	r.open(tiers.ColdStartClear)
	var stored []testPage
	full := false
	for b := 0; b < 400 && !full; b++ {
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
	hits := func(pages []testPage) (n int) {
		for i := 0; i < len(pages); i += 64 {
			n += countHits(r.get(pages[i:min(i+64, len(pages))], 0))
		}
		return n
	}
	// The refusal made GC take the pages then in use as the capacity and
	// evict the coldest down to gc_stop of it.
	var live []testPage
	for i := 0; i < len(stored); i += 64 {
		part := stored[i:min(i+64, len(stored))]
		for j, err := range r.get(part, 0) {
			if err == nil {
				live = append(live, part[j])
			}
		}
	}
	if len(live) < len(stored)*3/4 {
		t.Fatalf("%d of %d stored pages hit after the index filled", len(live), len(stored))
	}
	for i, p := range live[:len(live)/2] {
		if err := r.store.Delete(context.Background(), []tiers.Key{p.key}); err != nil {
			t.Fatalf("delete %d of %d after the index filled: %v, want success", i, len(live)/2, err)
		}
	}
	r.checkConsistent()
	if h := hits(live[:len(live)/2]); h != 0 {
		t.Fatalf("%d deleted pages still hit", h)
	}
	if h, want := hits(live[len(live)/2:]), len(live)-len(live)/2; h != want {
		t.Fatalf("%d of the %d pages not deleted hit", h, want)
	}
	// NB: deleting keys spread over the tree leaves its leaves half empty
	// (a B-tree merges a leaf only below a quarter full), so the deletes
	// above free few pages: a put after them may still be refused, and
	// its refusal makes GC evict the coldest. What was stored must hit.
	again := makePages(999, 50, 0, r.geom)
	var stored2 []testPage
	for i, err := range r.put(again, 0) {
		switch {
		case err == nil:
			stored2 = append(stored2, again[i])
		case !errors.Is(err, tiers.ErrFull):
			t.Fatalf("put %d after the deletes: %v, want success or ErrFull", i, err)
		}
	}
	if h := hits(stored2); h != len(stored2) {
		t.Fatalf("%d of %d pages put after the deletes hit", h, len(stored2))
	}
	r.checkConsistent()
	// Keep storing far past what the map holds: each refusal makes the
	// store evict a batch of its coldest pages, so the tier keeps
	// serving as a cache bounded by its index.
	var ok, refused int
	var last []testPage
	for b := 0; b < 300; b++ {
		last = makePages(uint64(2000+b), 50, 0, r.geom)
		for _, err := range r.put(last, 0) {
			switch {
			case err == nil:
				ok++
			case errors.Is(err, tiers.ErrFull):
				refused++
			default:
				t.Fatalf("put past full: %v, want success or ErrFull", err)
			}
		}
	}
	r.checkConsistent()
	if refused > ok/10 {
		t.Fatalf("past full: %d puts stored, %d refused: the store does not free index room by itself (%+v, cap %v)", ok, refused, r.store.Stats(), r.store.indexCap)
	}
	if h := hits(last); h < len(last)/2 {
		t.Fatalf("only %d of the newest %d pages hit", h, len(last))
	}
	if st := r.store.Stats(); st.Evictions == 0 {
		t.Fatalf("no evictions after %d puts past a full index", ok)
	}
	t.Logf("past full: %d stored, %d refused", ok, refused)
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

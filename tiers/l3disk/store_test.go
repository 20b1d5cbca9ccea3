package l3disk

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// TestConformance runs the Store v1 suite against l3disk over each real
// index.
// It runs over both slot layouts (ragged pages staged through a buffer;
// pages of whole blocks moved straight between the disk and the slab).
func TestConformance(t *testing.T) {
	for _, g := range layouts() {
		t.Run(g.name, func(t *testing.T) { conformance(t, g.geom, g.zeroCopy) })
	}
}

func conformance(t *testing.T, geom tiers.PayloadGeometry, zeroCopy string) {
	for _, ix := range testIndexes() {
		t.Run(ix.name, func(t *testing.T) {
			const slots = 96
			var last *rig
			tiertest.RunStore(t, tiertest.StoreHarness{
				Payload: geom,
				Open: func(t *testing.T) (tiers.Store, tiers.Slab) {
					r := newRig(t, ix, slots)
					r.geom = geom
					r.cfg.ZeroCopy = zeroCopy
					r.slab = tiertest.NewHeapSlab(2 * tiertest.SlabPages * r.pageSlot())
					last = r
					return r.open(tiers.ColdStartClear), r.slab
				},
				Reopen: func(t *testing.T) (tiers.Store, tiers.Slab) {
					r := last
					r.store = nil // the suite closed it
					if err := r.index.Close(); err != nil {
						t.Fatalf("close index: %v", err)
					}
					r.index = nil
					return r.open(tiers.ColdStartLoad), r.slab
				},
				CapacityPages: slots,
			})
		})
	}
}

// TestSpillReloadByteExact spills pages of both kinds, closes everything,
// reopens with cold start load and reads every page back byte for byte;
// then reopens with clear and finds nothing.
func TestSpillReloadByteExact(t *testing.T) {
	for _, ix := range testIndexes() {
		t.Run(ix.name, func(t *testing.T) {
			r := newRig(t, ix, 64)
			r.open(tiers.ColdStartClear)
			kv := makePages(1, 40, 0, r.geom)
			idx := makePages(2, 40, 1, r.geom)
			for _, pages := range [][]testPage{kv, idx} {
				for i, err := range r.put(pages, 0) {
					if err != nil {
						t.Fatalf("put item %d: %v", i, err)
					}
				}
			}
			r.checkConsistent()
			r.close()

			st := r.open(tiers.ColdStartLoad)
			if lc := st.LoadCounts(); lc.Live != 80 || lc.Orphans != 0 || lc.Dropped != 0 {
				t.Fatalf("load counts %+v, want 80 live, nothing else", lc)
			}
			for _, pages := range [][]testPage{kv, idx} {
				if h := countHits(r.get(pages, 100)); h != len(pages) {
					t.Fatalf("after load: %d of %d hit", h, len(pages))
				}
			}
			// Every hit hands back the sum it was verified against
			// (GetRequest.Sum), the CRC-32C of the bytes it left in Dst.
			if n := r.checkGetSums(kv); n != len(kv) {
				t.Fatalf("%d of %d hits carried their sum", n, len(kv))
			}
			r.checkConsistent()
			r.close()

			r.open(tiers.ColdStartClear)
			if h := countHits(r.get(kv, 100)); h != 0 {
				t.Fatalf("after clear: %d hits, want 0", h)
			}
			r.checkConsistent()
		})
	}
}

// TestGCWatermarks fills a kind past gc_start and checks the writer
// reclaims coldest pages first down to gc_stop, keeps touched pages, and
// never fails a put for room.
func TestGCWatermarks(t *testing.T) {
	r := newRig(t, testIndexes()[0], 40)
	r.cfg.GCBatch = 4
	r.open(tiers.ColdStartClear)
	first := makePages(10, 30, 0, r.geom)
	for i, err := range r.put(first, 0) {
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	// Keep the first 4 warm: touch them before every batch.
	keys := []tiers.Key{first[0].key, first[1].key, first[2].key, first[3].key}
	more := makePages(11, 40, 0, r.geom)
	for i := 0; i < len(more); i += 8 {
		if err := r.store.Touch(context.Background(), keys); err != nil {
			t.Fatal(err)
		}
		for j, err := range r.put(more[i:i+8], 0) {
			if err != nil {
				t.Fatalf("put %d: %v", i+j, err)
			}
		}
	}
	r.checkConsistent()
	st := r.store.Stats()
	if st.Evictions == 0 {
		t.Fatalf("no evictions after 70 puts into 40 slots: %+v", st)
	}
	used := int(st.Pages)
	if used > 40 || used < int(0.85*40)-1 {
		t.Fatalf("%d pages live in 40 slots, want about gc_stop..gc_start", used)
	}
	if h := countHits(r.get(first[:4], 100)); h != 4 {
		t.Fatalf("touched pages: %d of 4 survived", h)
	}
	if h := countHits(r.get(first[4:12], 100)); h != 0 {
		t.Fatalf("coldest untouched pages: %d of 8 survived, want 0", h)
	}
	if h := countHits(r.get(more[32:], 100)); h != 8 {
		t.Fatalf("newest pages: %d of 8 survived", h)
	}
}

// TestSecondOpenerRefused: a second store on the same slab files fails
// with ErrInUse naming the file.
func TestSecondOpenerRefused(t *testing.T) {
	r := newRig(t, testIndexes()[0], 8)
	r.open(tiers.ColdStartClear)
	env := r.env(tiers.ColdStartLoad)
	_, err := Open(context.Background(), env, r.cfg)
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), r.dir) {
		t.Fatalf("second open: %v, want ErrInUse naming %s", err, r.dir)
	}
}

// TestRequirePLP: with an impossible latency limit the probe fails the
// open; without require_plp the same result only logs.
func TestRequirePLP(t *testing.T) {
	r := newRig(t, testIndexes()[0], 8)
	r.index = r.ixOpen.open(t, r.ixDir)
	t.Cleanup(r.close)
	r.cfg.PLPProbes = 3
	r.cfg.PLPMaxSync = time.Nanosecond
	r.cfg.RequirePLP = true
	if _, err := Open(context.Background(), r.env(tiers.ColdStartClear), r.cfg); !errors.Is(err, ErrNoPLP) {
		t.Fatalf("open with require_plp on a slow disk: %v, want ErrNoPLP", err)
	}
	r.cfg.RequirePLP = false
	st, err := Open(context.Background(), r.env(tiers.ColdStartClear), r.cfg)
	if err != nil {
		t.Fatalf("open without require_plp: %v", err)
	}
	defer st.Close()
	if p := st.PLP(); p.Probes != 3 || p.Median <= 0 || p.Protected {
		t.Fatalf("probe result %+v", p)
	}
	entries, _ := os.ReadDir(r.dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), "plp-probe") {
			t.Fatalf("probe file %s left behind", e.Name())
		}
	}
}

// TestGeometryChange: a slab made for other geometry is refused by load
// (with advice) and recreated by clear.
func TestGeometryChange(t *testing.T) {
	r := newRig(t, testIndexes()[0], 8)
	r.open(tiers.ColdStartClear)
	r.close()
	r.cfg.Slots = 16
	r.index = r.ixOpen.open(t, r.ixDir)
	_, err := Open(context.Background(), r.env(tiers.ColdStartLoad), r.cfg)
	if err == nil || !strings.Contains(err.Error(), "cold_start: clear") {
		t.Fatalf("load over other geometry: %v", err)
	}
	st := r.open(tiers.ColdStartClear)
	if got := st.files[0].sb.Slots; got != 16 {
		t.Fatalf("recreated slab has %d slots, want 16", got)
	}
	pages := makePages(3, 16, 0, r.geom)
	for i, err := range r.put(pages, 0) {
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	r.checkConsistent()
}

// TestDeleteInFlight: a Delete of a key still being written returns after
// the write lands, and the key is gone.
func TestDeleteInFlight(t *testing.T) {
	r := newRig(t, testIndexes()[0], 32)
	r.open(tiers.ColdStartClear)
	pages := makePages(4, 16, 0, r.geom)
	reqs := make([]tiers.PutRequest, len(pages))
	for i, p := range pages {
		sp := r.span(i, 0)
		b, _ := r.slab.Bytes(sp)
		copy(b, p.data)
		reqs[i] = tiers.PutRequest{Key: p.key, Src: sp}
	}
	id, err := r.store.Put(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]tiers.Key, len(pages))
	for i, p := range pages {
		keys[i] = p.key
	}
	if err := r.store.Delete(context.Background(), keys); err != nil {
		t.Fatalf("delete: %v", err)
	}
	r.waitBatch(id, len(pages))
	// Whatever was in flight at Delete is gone; whatever was queued behind
	// it may have landed after. Delete again, then nothing may remain.
	if err := r.store.Delete(context.Background(), keys); err != nil {
		t.Fatal(err)
	}
	if h := countHits(r.get(pages, 100)); h != 0 {
		t.Fatalf("%d hits after delete", h)
	}
	r.checkConsistent()
}

// TestStaleSweep: after clear, the old epoch's index entries are removed
// in the background.
func TestStaleSweep(t *testing.T) {
	r := newRig(t, testIndexes()[0], 32)
	r.open(tiers.ColdStartClear)
	pages := makePages(5, 20, 0, r.geom)
	r.put(pages, 0)
	r.close()
	r.open(tiers.ColdStartClear)
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := r.index.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.Entries == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d stale entries left after 10s", st.Entries)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSharedIndexRanks: two ranks on one disk and one index keep separate
// slab files; neither reads, drops or reclaims the other's pages.
func TestSharedIndexRanks(t *testing.T) {
	base := t.TempDir()
	ix := openBadger(t, filepath.Join(base, "index"))
	defer ix.Close()
	slab := tiertest.NewHeapSlab(64 * 20000)
	cfg := testConfig(filepath.Join(base, "disk"), 16)
	open := func(rank int, mode tiers.ColdStart) *Store {
		st, err := Open(context.Background(), tiers.Env{
			Logger: testLogger(t), Payload: testGeometry, Rank: rank, WorldSize: 2, StackID: "s",
			Slab: slab, ColdStart: mode, Index: ix,
		}, cfg)
		if err != nil {
			t.Fatalf("open rank %d: %v", rank, err)
		}
		return st
	}
	a, b := open(0, tiers.ColdStartClear), open(1, tiers.ColdStartClear)
	ra := &rig{t: t, store: a, slab: slab, geom: testGeometry}
	rb := &rig{t: t, store: b, slab: slab, geom: testGeometry}
	pa, pb := makePages(6, 8, 0, testGeometry), makePages(7, 8, 0, testGeometry)
	ra.put(pa, 0)
	rb.put(pb, 8)
	if h := countHits(rb.get(pa, 16)); h != 0 {
		t.Fatalf("rank 1 read %d of rank 0's pages", h)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	// Rank 0 restarts with clear: its epoch bump and sweep leave rank 1 alone.
	a = open(0, tiers.ColdStartClear)
	ra.store = a
	defer a.Close()
	defer b.Close()
	time.Sleep(50 * time.Millisecond)
	if h := countHits(rb.get(pb, 16)); h != len(pb) {
		t.Fatalf("rank 1 lost pages after rank 0's clear: %d of %d", h, len(pb))
	}
	if h := countHits(ra.get(pa, 16)); h != 0 {
		t.Fatalf("rank 0 still has %d pages after clear", h)
	}
}

// TestLongestPrefixStale: entries of an old epoch do not count.
func TestLongestPrefixStale(t *testing.T) {
	r := newRig(t, testIndexes()[0], 16)
	r.open(tiers.ColdStartClear)
	pages := makePages(8, 5, 0, r.geom)
	r.put(pages, 0)
	chain := make([]pagehash.Hash, len(pages))
	for i, p := range pages {
		chain[i] = p.key.Hash
	}
	if n, err := r.store.LongestPrefix(context.Background(), 0, chain); err != nil || n != 5 {
		t.Fatalf("longest prefix %d, %v", n, err)
	}
	r.close()
	r.open(tiers.ColdStartClear)
	if n, err := r.store.LongestPrefix(context.Background(), 0, chain); err != nil || n != 0 {
		t.Fatalf("longest prefix after clear %d, %v; want 0", n, err)
	}
}

// TestODirectModes: "on" fails on tmpfs, "auto" falls back there, and
// every mode round-trips pages on a disk file system.
func TestODirectModes(t *testing.T) {
	shm := "/dev/shm"
	if _, err := os.Stat(shm); err != nil {
		t.Skipf("no %s to test the O_DIRECT fallback on", shm)
	}
	dir, err := os.MkdirTemp(shm, "kvtier-l3-test-")
	if err != nil {
		t.Skipf("cannot use %s: %v", shm, err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, tc := range []struct {
		name, mode, dir string
		wantErr         bool
		wantDirect      bool
	}{
		{"on-tmpfs", ODirectOn, filepath.Join(dir, "on"), true, false},
		{"auto-tmpfs", ODirectAuto, filepath.Join(dir, "auto"), false, false},
		{"off-disk", ODirectOff, "", false, false},
		{"auto-disk", ODirectAuto, "", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, testIndexes()[0], 8)
			if tc.dir != "" {
				r.dir = tc.dir
				r.cfg.Disks[0].Dir = tc.dir
			}
			r.cfg.ODirect = tc.mode
			r.index = r.ixOpen.open(t, r.ixDir)
			t.Cleanup(r.close)
			if tc.dir != "" && tmpfsTakesDirect(t, tc.dir) {
				t.Skip("this kernel's tmpfs accepts O_DIRECT; no fallback to test")
			}
			st, err := OpenFS(context.Background(), r.env(tiers.ColdStartClear), r.cfg, diskfs.OS{})
			if tc.wantErr {
				if err == nil || !errors.Is(err, diskfs.ErrDirectRefused) {
					t.Fatalf("open: %v, want ErrDirectRefused", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			r.store = st
			if st.Direct() != tc.wantDirect {
				if tc.wantDirect {
					t.Skipf("this file system refuses O_DIRECT")
				}
				t.Fatalf("direct = %v, want %v", st.Direct(), tc.wantDirect)
			}
			pages := makePages(9, 4, 0, r.geom)
			r.put(pages, 0)
			if h := countHits(r.get(pages, 8)); h != 4 {
				t.Fatalf("%d of 4 hit", h)
			}
		})
	}
}

// TestOwnsRecordForeign: a record naming another disk is a miss that
// leaves the entry alone.
func TestOwnsRecordForeign(t *testing.T) {
	r := newRig(t, testIndexes()[0], 8)
	r.open(tiers.ColdStartClear)
	p := makePages(12, 1, 0, r.geom)[0]
	foreign := indexes.Record{Disk: 3, Kind: 0, Slot: 1, Epoch: r.store.files[0].epoch()}
	if err := r.index.Put(context.Background(), []indexes.Entry{{Key: p.key.IndexKey(), Record: foreign}}); err != nil {
		t.Fatal(err)
	}
	if h := countHits(r.get([]testPage{p}, 0)); h != 0 {
		t.Fatal("foreign record hit")
	}
	recs, found := make([]indexes.Record, 1), make([]bool, 1)
	if err := r.index.Get(context.Background(), []indexes.Key{p.key.IndexKey()}, recs, found); err != nil || !found[0] {
		t.Fatalf("foreign entry was dropped: %v %v", found, err)
	}
}

// tmpfsTakesDirect reports whether O_DIRECT opens succeed in dir's file
// system (tmpfs accepts it since Linux 6.6).
func tmpfsTakesDirect(t *testing.T, dir string) bool {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "probe")
	f, err := diskfs.OS{}.OpenFile(p, diskfs.OpenOptions{Create: true, Direct: true})
	if err != nil {
		return false
	}
	f.Close()
	os.Remove(p)
	return true
}

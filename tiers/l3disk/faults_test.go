package l3disk

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs/errorfs"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// TestFaultMatrix injects each fault of the file-system seam under puts
// and gets and checks the store's promise: whatever Get returns is the
// right bytes or a miss (never wrong bytes), failed puts are reported as
// failed, and no slot leaks (free + live = total, index and pools agree).
//
// It runs over both slot layouts: ragged pages (the payload right after
// the header, staged through a buffer) and pages of whole blocks (the
// payload one block in, written from and read into the slab span
// directly).
func TestFaultMatrix(t *testing.T) {
	for _, g := range layouts() {
		t.Run(g.name, func(t *testing.T) { faultMatrix(t, g.geom, g.zeroCopy) })
	}
}

func faultMatrix(t *testing.T, geom tiers.PayloadGeometry, zeroCopy string) {
	const k0 = "-k0.slab"
	pb := int(geom.Kinds[0].PageBytes)
	po := int(PayloadOffset(FormatVersion, int64(pb)))
	pad := int(SlotBytes(int64(pb))) - po - pb
	type outcome struct {
		failedPuts   int  // of the 8 faulted puts
		hitsAfter    int  // of the 8 faulted pages, read back after the fault is cleared
		readOnly     bool // kind 0's slab turned read-only
		wantErr      error
		faultOnGet   bool // inject during the get of the baseline pages instead
		baselineHits int  // of the 8 baseline pages, read during a get fault
	}
	for _, tc := range []struct {
		name  string
		rule  *errorfs.Rule
		want  outcome
		check func(t *testing.T, r *rig)
	}{
		{"eio-on-write", rule(errorfs.OpWrite, k0, 0, 3, errorfs.Fault{Kind: errorfs.Fail, Err: unix.EIO}),
			outcome{failedPuts: 3, hitsAfter: 5, wantErr: unix.EIO}, nil},
		{"enospc-on-write", rule(errorfs.OpWrite, k0, 2, 2, errorfs.Fault{Kind: errorfs.Fail, Err: unix.ENOSPC}),
			outcome{failedPuts: 2, hitsAfter: 6, wantErr: unix.ENOSPC}, nil},
		{"short-write", rule(errorfs.OpWrite, k0, 0, 1, errorfs.Fault{Kind: errorfs.ShortWrite, Keep: 8192}),
			outcome{failedPuts: 1, hitsAfter: 7, wantErr: unix.EIO}, nil},
		{"torn-write-4k", rule(errorfs.OpWrite, k0, 1, 2, errorfs.Fault{Kind: errorfs.TornWrite, Keep: 4096}),
			outcome{failedPuts: 0, hitsAfter: 6}, nil},
		{"torn-write-header-lost", rule(errorfs.OpWrite, k0, 0, 1, errorfs.Fault{Kind: errorfs.TornWrite, Keep: 0}),
			outcome{failedPuts: 0, hitsAfter: 7}, nil},
		{"bitflip-header-on-write", rule(errorfs.OpWrite, k0, 0, 2, errorfs.Fault{Kind: errorfs.FlipBit, At: 20, Bit: 3}),
			outcome{failedPuts: 0, hitsAfter: 6}, nil},
		{"bitflip-payload-on-write", rule(errorfs.OpWrite, k0, 3, 1, errorfs.Fault{Kind: errorfs.FlipBit, At: po + 777, Bit: 0}),
			outcome{failedPuts: 0, hitsAfter: 7}, nil},
		{"bitflip-payload-pad-on-write", rule(errorfs.OpWrite, k0, 0, 8, errorfs.Fault{Kind: errorfs.FlipBit, At: po + pb + pad/2, Bit: 0}),
			outcome{failedPuts: 0, hitsAfter: 8}, nil}, // the pad is not payload: still a hit
		{"bitflip-header-block-pad-on-write", rule(errorfs.OpWrite, k0, 0, 8, errorfs.Fault{Kind: errorfs.FlipBit, At: HeaderSize + (po-HeaderSize)/2, Bit: 0}),
			outcome{failedPuts: 0, hitsAfter: 8}, nil}, // nor is the rest of the header's block
		{"bitflip-header-on-read", rule(errorfs.OpRead, k0, 0, 2, errorfs.Fault{Kind: errorfs.FlipBit, At: 50, Bit: 7}),
			outcome{faultOnGet: true, baselineHits: 6}, nil},
		{"bitflip-payload-on-read", rule(errorfs.OpRead, k0, 0, 3, errorfs.Fault{Kind: errorfs.FlipBit, At: po + pb - 1, Bit: 1}),
			outcome{faultOnGet: true, baselineHits: 5}, nil},
		{"eio-on-read", rule(errorfs.OpRead, k0, 0, 1, errorfs.Fault{Kind: errorfs.Fail, Err: unix.EIO}),
			outcome{faultOnGet: true, baselineHits: 7}, nil},
		{"latency-on-write", rule(errorfs.OpWrite, k0, 0, 0, errorfs.Fault{Kind: errorfs.Delay, Latency: 5 * time.Millisecond}),
			outcome{failedPuts: 0, hitsAfter: 8}, nil},
		{"eio-on-fsync", rule(errorfs.OpSync, k0, 0, 1, errorfs.Fault{Kind: errorfs.Fail, Err: unix.EIO}),
			outcome{failedPuts: 8, hitsAfter: 0, readOnly: true, wantErr: ErrReadOnly},
			func(t *testing.T, r *rig) {
				// Never retried: later puts of kind 0 fail without another
				// fsync; kind 1 still works; old pages still read.
				more := makePages(99, 4, 0, r.geom)
				for i, err := range r.put(more, 40) {
					if !errors.Is(err, ErrReadOnly) || !errors.Is(err, tiers.ErrBroken) {
						t.Fatalf("put %d after fsync failure: %v, want ErrReadOnly and ErrBroken", i, err)
					}
				}
				other := makePages(98, 4, 1, r.geom)
				for i, err := range r.put(other, 40) {
					if err != nil {
						t.Fatalf("kind 1 put %d after kind 0's fsync failure: %v", i, err)
					}
				}
				if ro := r.store.ReadOnly(); ro[0] == nil || ro[1] != nil {
					t.Fatalf("read-only per kind: %v", ro)
				}
			}},
	} {
		if tc.rule.Fault.Kind == errorfs.FlipBit && tc.rule.Fault.At < 0 || strings.HasSuffix(tc.name, "pad-on-write") && pad == 0 ||
			strings.HasPrefix(tc.name, "bitflip-header-block-pad") && po == HeaderSize {
			continue // no such bytes in this layout
		}
		// Each fault with the store's own sums and with the producer's
		// (carried, PutRequest.Sum): the outcomes are the same.
		for _, sums := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/sums=%t", tc.name, sums), func(t *testing.T) {
				// A fresh rule a run: a rule counts what it saw and fired.
				rl := rule(tc.rule.Op, tc.rule.PathContains, tc.rule.Skip, tc.rule.Count, tc.rule.Fault)
				r := newRig(t, testIndexes()[0], 48)
				r.geom = geom
				r.slab = tiertest.NewHeapSlab(r.slabCap * r.pageSlot())
				r.cfg.ZeroCopy = zeroCopy
				r.sums = sums
				efs := errorfs.Wrap(diskfs.OS{}, nil)
				r.fs = efs
				r.open(tiers.ColdStartClear)
				base := makePages(1, 8, 0, r.geom)
				for i, err := range r.put(base, 0) {
					if err != nil {
						t.Fatalf("baseline put %d: %v", i, err)
					}
				}
				faulted := makePages(2, 8, 0, r.geom)
				efs.SetInjector(rl)
				if tc.want.faultOnGet {
					// r.get fails the test on wrong bytes.
					if h := countHits(r.get(base, 16)); h != tc.want.baselineHits {
						t.Fatalf("baseline hits during read fault: %d, want %d", h, tc.want.baselineHits)
					}
					efs.SetInjector(nil)
					if h := countHits(r.get(base, 16)); h != tc.want.baselineHits {
						t.Fatalf("baseline hits after read fault: %d, want %d (bad entries are dropped)", h, tc.want.baselineHits)
					}
				} else {
					failed := 0
					for _, err := range r.put(faulted, 8) {
						if err != nil {
							failed++
							if tc.want.wantErr != nil && !errors.Is(err, tc.want.wantErr) {
								t.Fatalf("failed put: %v, want %v", err, tc.want.wantErr)
							}
						}
					}
					efs.SetInjector(nil)
					if failed != tc.want.failedPuts {
						t.Fatalf("%d puts failed, want %d", failed, tc.want.failedPuts)
					}
					if h := countHits(r.get(faulted, 16)); h != tc.want.hitsAfter {
						t.Fatalf("%d faulted pages hit, want %d", h, tc.want.hitsAfter)
					}
					if h := countHits(r.get(base, 16)); h != 8 {
						t.Fatalf("baseline pages: %d of 8 hit after the fault", h)
					}
				}
				if rl.Fired() == 0 {
					t.Fatalf("fault never fired")
				}
				if ro := r.store.ReadOnly()[0] != nil; ro != tc.want.readOnly {
					t.Fatalf("read-only = %v, want %v", ro, tc.want.readOnly)
				}
				if tc.check != nil {
					tc.check(t, r)
				}
				r.checkConsistent()
				r.checkDirect()
				st := r.store.Stats()
				if tc.want.hitsAfter < 8-tc.want.failedPuts || tc.want.baselineHits < 8 && tc.want.faultOnGet {
					if st.Corrupt == 0 {
						t.Fatalf("verification failures not counted: %+v", st)
					}
				}
			})
		}
	}
}

func rule(op errorfs.Op, path string, skip, count int64, f errorfs.Fault) *errorfs.Rule {
	r := errorfs.NewRule(op, f, 1)
	r.PathContains, r.Skip, r.Count = path, skip, count
	return r
}

// TestDirectRefusedFallback: where the file system refuses O_DIRECT, auto
// falls back to buffered I/O (reported once) and on fails the open.
func TestDirectRefusedFallback(t *testing.T) {
	refuse := errorfs.InjectorFunc(func(e errorfs.Event) *errorfs.Fault {
		if e.Op == errorfs.OpOpen && e.Direct {
			return &errorfs.Fault{Kind: errorfs.Fail, Err: diskfs.ErrDirectRefused}
		}
		return nil
	})
	r := newRig(t, testIndexes()[0], 8)
	r.fs = errorfs.Wrap(diskfs.OS{}, refuse)
	r.cfg.PLPProbes = 2
	st := r.open(tiers.ColdStartClear)
	if st.Direct() || st.PLP().Direct {
		t.Fatalf("direct = %v (probe %v) on a file system refusing O_DIRECT", st.Direct(), st.PLP().Direct)
	}
	pages := makePages(3, 4, 1, r.geom)
	r.put(pages, 0)
	if h := countHits(r.get(pages, 8)); h != 4 {
		t.Fatalf("%d of 4 hit in buffered mode", h)
	}
	r.close()
	r.cfg.ODirect = ODirectOn
	r.index = r.ixOpen.open(t, r.ixDir)
	if _, err := OpenFS(t.Context(), r.env(tiers.ColdStartLoad), r.cfg, r.fs); !errors.Is(err, diskfs.ErrDirectRefused) {
		t.Fatalf("o_direct on: %v, want ErrDirectRefused", err)
	}
}

// TestLoadDropsDamage: cold start load drops index entries whose slot
// header is damaged and frees orphans (written, never indexed).
func TestLoadDropsDamage(t *testing.T) {
	r := newRig(t, testIndexes()[0], 32)
	efs := errorfs.Wrap(diskfs.OS{}, nil)
	r.fs = efs
	r.open(tiers.ColdStartClear)
	good := makePages(1, 10, 0, r.geom)
	r.put(good, 0)
	// Two pages whose header is flipped on disk (indexed, but damaged).
	efs.SetInjector(rule(errorfs.OpWrite, "-k0.slab", 0, 2, errorfs.Fault{Kind: errorfs.FlipBit, At: 40, Bit: 2}))
	bad := makePages(2, 2, 0, r.geom)
	r.put(bad, 10)
	efs.SetInjector(nil)
	epoch, path := r.store.files[0].epoch(), r.store.files[0].path
	r.close()
	// An orphan: a valid slot written and synced, never indexed (a crash
	// between fdatasync and the index commit).
	orphan := makePages(3, 1, 0, r.geom)[0]
	buf := make([]byte, SlotBytes(20000))
	copy(buf[HeaderSize:], orphan.data)
	SlotHeader{Kind: 0, Epoch: epoch, Hash: orphan.key.Hash, PayloadLen: 20000, PayloadCRC: PayloadCRC(orphan.data)}.Encode(buf)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(buf, superblockSize+30*SlotBytes(20000)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	r.open(tiers.ColdStartLoad)
	lc := r.store.LoadCounts()
	if lc.Live != 10 || lc.Dropped != 2 || lc.Orphans != 1 {
		t.Fatalf("load counts %+v, want 10 live, 2 dropped, 1 orphan", lc)
	}
	if h := countHits(r.get([]testPage{orphan}, 12)); h != 0 {
		t.Fatal("orphan hit")
	}
	if h := countHits(r.get(good, 12)); h != 10 {
		t.Fatalf("%d of 10 good pages hit after load", h)
	}
	if h := countHits(r.get(bad, 12)); h != 0 {
		t.Fatalf("%d damaged pages hit", h)
	}
	r.checkConsistent()
}

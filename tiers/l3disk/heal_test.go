package l3disk

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// soak reports whether the long damage runs are asked for (KVTIER_SOAK=1).
func soak() bool { return os.Getenv("KVTIER_SOAK") == "1" }

// slabPath returns the rig's slab file of kind k.
func (r *rig) slabPath(k uint8) string {
	return filepath.Join(r.dir, SlabFileName("test", 0, k))
}

// putAll puts pages from slab page 0 on and fails the test unless every
// one is acked durable.
func (r *rig) putAll(pages []testPage) {
	r.t.Helper()
	if errs := r.put(pages, 0); countHits(errs) != len(pages) {
		r.t.Fatalf("put: %v", errs)
	}
}

// slotsOf returns the slot each page's index entry names.
func (r *rig) slotsOf(pages []testPage) []int64 {
	r.t.Helper()
	keys := make([]indexes.Key, len(pages))
	for i, p := range pages {
		keys[i] = p.key.IndexKey()
	}
	recs, found := make([]indexes.Record, len(keys)), make([]bool, len(keys))
	if err := r.index.Get(context.Background(), keys, recs, found); err != nil {
		r.t.Fatal(err)
	}
	out := make([]int64, len(pages))
	for i := range pages {
		if !found[i] {
			r.t.Fatalf("page %d not indexed", i)
		}
		out[i] = int64(recs[i].Slot)
	}
	return out
}

// flipByte xors one byte of a file.
func flipByte(t testing.TB, path string, off int64, mask byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= mask
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func chainOf(pages []testPage) []pagehash.Hash {
	out := make([]pagehash.Hash, len(pages))
	for i, p := range pages {
		out[i] = p.key.Hash
	}
	return out
}

// TestSuperblockFlipEpochNeverBackwards flips superblock bytes after a
// clear moved the epoch past 1 and checks that no old entry is ever
// reported present after the next clear or load.
func TestSuperblockFlipEpochNeverBackwards(t *testing.T) {
	step := 13
	if soak() {
		step = 1
	}
	for _, ixo := range testIndexes() {
		for _, mode := range []tiers.ColdStart{tiers.ColdStartClear, tiers.ColdStartLoad} {
			for off := 0; off < superEncodedLen; off += step {
				r := newRig(t, ixo, 64)
				r.open(tiers.ColdStartClear)
				r.close()
				r.open(tiers.ColdStartClear) // epoch generation 3
				pages := makePages(uint64(off), 50, 0, r.geom)
				r.putAll(pages)
				r.close()
				flipByte(t, r.slabPath(0), int64(off), 0x10)
				st := r.open(mode)
				n, err := st.LongestPrefix(context.Background(), 0, chainOf(pages))
				if err != nil {
					t.Fatal(err)
				}
				hits := countHits(r.get(pages, 0))
				if n > hits {
					t.Fatalf("%s %s superblock byte %d flipped: LongestPrefix %d but %d of %d Gets hit", ixo.name, mode, off, n, hits, len(pages))
				}
				if e := st.files[0].epoch() >> 16; e <= 2 {
					t.Fatalf("%s %s superblock byte %d flipped: epoch generation %d, want > 2 (it went backwards)", ixo.name, mode, off, e)
				}
				r.close()
			}
		}
	}
}

// TestDurableAckAfterPayloadRot rots payloads, reopens with load, re-puts
// every page before any Get, and checks that every durable ack is
// followed by a hit.
func TestDurableAckAfterPayloadRot(t *testing.T) {
	for _, ixo := range testIndexes() {
		t.Run(ixo.name, func(t *testing.T) {
			const n = 200
			r := newRig(t, ixo, 256)
			r.open(tiers.ColdStartClear)
			pages := makePages(7, n, 0, r.geom)
			if errs := r.put(pages, 0); countHits(errs) != n {
				t.Fatalf("put: %v", errs)
			}
			slots := r.slotsOf(pages)
			sb := r.store.files[0].sb.SlotBytes
			r.close()
			rotted := 0
			for i := 0; i < n; i += 17 {
				flipByte(t, r.slabPath(0), superblockSize+slots[i]*sb+HeaderSize+int64(i), 0x01)
				rotted++
			}
			r.open(tiers.ColdStartLoad)
			for i := 0; i < n; i += 100 {
				errs := r.put(pages[i:i+100], 0)
				res := r.get(pages[i:i+100], 100)
				for j := range errs {
					if errs[j] == nil && res[j] != nil {
						t.Fatalf("page %d acked durable, then Get: %v", i+j, res[j])
					}
				}
			}
			if got := r.store.Stats().Corrupt; got < int64(rotted) {
				t.Errorf("corrupt count %d, want at least the %d rotted slots", got, rotted)
			}
			r.checkConsistent()
		})
	}
}

// TestRefusesNonRegularSlab plants a symlink, a FIFO and a directory
// where a slab file belongs and checks that the open refuses each by name
// and that the symlink's victim is untouched.
func TestRefusesNonRegularSlab(t *testing.T) {
	cases := []struct {
		name  string
		plant func(t *testing.T, path, victim string)
	}{
		{"symlink", func(t *testing.T, path, victim string) {
			if err := os.Symlink(victim, path); err != nil {
				t.Fatal(err)
			}
		}},
		{"dangling symlink", func(t *testing.T, path, victim string) {
			if err := os.Symlink(victim+".absent", path); err != nil {
				t.Fatal(err)
			}
		}},
		{"fifo", func(t *testing.T, path, _ string) {
			if err := syscall.Mkfifo(path, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"directory", func(t *testing.T, path, _ string) {
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, c := range cases {
		for _, mode := range []tiers.ColdStart{tiers.ColdStartClear, tiers.ColdStartLoad} {
			t.Run(c.name+"/"+string(mode), func(t *testing.T) {
				r := newRig(t, testIndexes()[1], 16)
				victim := filepath.Join(t.TempDir(), "victim")
				want := []byte("precious bytes that are not a slab")
				if err := os.WriteFile(victim, want, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.MkdirAll(r.dir, 0o755); err != nil {
					t.Fatal(err)
				}
				path := r.slabPath(0)
				c.plant(t, path, victim)
				r.index = r.ixOpen.open(t, r.ixDir)
				st, err := OpenFS(context.Background(), r.env(mode), r.cfg, r.fs)
				if err == nil {
					_ = st.Close()
					t.Fatalf("open succeeded with a %s in place of %s", c.name, path)
				}
				if !errors.Is(err, diskfs.ErrNotRegular) || !strings.Contains(err.Error(), path) {
					t.Fatalf("error %q: want ErrNotRegular naming %s", err, path)
				}
				if got, _ := os.ReadFile(victim); !bytes.Equal(got, want) {
					t.Fatalf("victim changed: %q", got)
				}
				if _, err := os.Stat(victim + ".absent"); err == nil {
					t.Fatal("a dangling symlink's target was created")
				}
				r.close()
			})
		}
	}
}

// TestTruncatedSlabKeepsIntactSlots truncates a slab mid-file and checks
// that load keeps every page wholly below the cut.
func TestTruncatedSlabKeepsIntactSlots(t *testing.T) {
	for _, ixo := range testIndexes() {
		t.Run(ixo.name, func(t *testing.T) {
			r := newRig(t, ixo, 64)
			r.open(tiers.ColdStartClear)
			pages := makePages(3, 40, 0, r.geom)
			r.putAll(pages)
			slots := r.slotsOf(pages)
			sb := r.store.files[0].sb.SlotBytes
			r.close()
			cut := superblockSize + 20*sb + sb/2 // slot 20 torn, 21.. gone
			if err := os.Truncate(r.slabPath(0), cut); err != nil {
				t.Fatal(err)
			}
			r.open(tiers.ColdStartLoad)
			res := r.get(pages, 0)
			for i, s := range slots {
				if intact := s < 20; intact != (res[i] == nil) {
					t.Fatalf("page %d in slot %d: intact %v, get %v", i, s, intact, res[i])
				}
			}
			r.checkConsistent()
		})
	}
}

// TestRebuildMissingIndex deletes the index and checks that load gets back
// every page from the slot headers.
func TestRebuildMissingIndex(t *testing.T) {
	for _, ixo := range testIndexes() {
		for _, geom := range []string{"ragged", "blocks"} {
			t.Run(ixo.name+"/"+geom, func(t *testing.T) { rebuildMissingIndex(t, ixo, crashGeometry(geom)) })
		}
	}
}

func rebuildMissingIndex(t *testing.T, ixo indexOpener, geom tiers.PayloadGeometry) {
	r := newRig(t, ixo, 128)
	r.geom = geom
	r.slab = tiertest.NewHeapSlab(r.slabCap * r.pageSlot())
	r.open(tiers.ColdStartClear)
	pages := makePages(11, 100, 0, r.geom)
	pages = append(pages, makePages(12, 50, 1, r.geom)...)
	r.putAll(pages)
	r.close()
	if err := os.RemoveAll(r.ixDir); err != nil {
		t.Fatal(err)
	}
	st := r.open(tiers.ColdStartLoad)
	if got := st.Rebuilt().Kept; got != int64(len(pages)) {
		t.Fatalf("rebuild kept %d pages, want %d", got, len(pages))
	}
	if hits := countHits(r.get(pages, 0)); hits != len(pages) {
		t.Fatalf("%d of %d pages back after the rebuild", hits, len(pages))
	}
	r.checkConsistent()
	r.close()
	st = r.open(tiers.ColdStartLoad)
	if got := st.LoadCounts().Live; got != int64(len(pages)) {
		t.Fatalf("second load: %d live, want %d", got, len(pages))
	}
}

// TestRolledBackSlab restores an older copy of a slab file (an older
// epoch than the index has seen) and checks that load moves the file past
// every epoch the index knows and reports nothing present that misses.
func TestRolledBackSlab(t *testing.T) {
	for _, ixo := range testIndexes() {
		t.Run(ixo.name, func(t *testing.T) {
			r := newRig(t, ixo, 64)
			r.open(tiers.ColdStartClear)
			old := makePages(21, 20, 0, r.geom)
			r.putAll(old)
			r.close()
			backup, err := os.ReadFile(r.slabPath(0))
			if err != nil {
				t.Fatal(err)
			}
			st := r.open(tiers.ColdStartClear)
			newer := st.files[0].epoch()
			pages := makePages(22, 20, 0, r.geom)
			r.putAll(pages)
			r.close()
			if err := os.WriteFile(r.slabPath(0), backup, 0o644); err != nil {
				t.Fatal(err)
			}
			st = r.open(tiers.ColdStartLoad)
			if got := st.files[0].epoch(); got <= newer {
				t.Fatalf("epoch %#x after load of a rolled-back file, want above the index's %#x", got, newer)
			}
			for _, set := range [][]testPage{old, pages} {
				n, err := st.LongestPrefix(context.Background(), 0, chainOf(set))
				if err != nil {
					t.Fatal(err)
				}
				if hits := countHits(r.get(set, 0)); n > hits {
					t.Fatalf("LongestPrefix %d but %d Gets hit", n, hits)
				}
			}
			r.checkConsistent()
		})
	}
}

// TestSuperblockErrorWording checks that a bad superblock is called one
// (not a bad slot header) and still matches ErrBadHeader.
func TestSuperblockErrorWording(t *testing.T) {
	_, err := decodeSuperblock(make([]byte, superEncodedLen))
	if !errors.Is(err, ErrBadSuperblock) || !errors.Is(err, ErrBadHeader) || strings.Contains(err.Error(), "slot header") {
		t.Fatalf("decode of a zeroed superblock: %v", err)
	}
}

// TestUnfinishedRebuildRedone leaves an index as a rebuild stopped halfway
// leaves it (half the entries, the rebuild mark still there) and checks
// that load rebuilds instead of freeing the slots the index does not name,
// and removes the mark once the rebuilt entries are durable. Without the
// mark the same index is trusted: the case that shows why the mark exists.
// A mark that is not a regular file is refused by name.
func TestUnfinishedRebuildRedone(t *testing.T) {
	for _, ixo := range testIndexes() {
		for _, tc := range []struct {
			name   string
			mark   func(t *testing.T, path string)
			want   string // error text; "" to open
			all    bool   // every page is back
			repair bool   // inspect --repair first
		}{
			{name: "mark", all: true, mark: func(t *testing.T, path string) {
				if err := os.WriteFile(path, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}},
			{name: "mark-repaired", all: true, repair: true, mark: func(t *testing.T, path string) {
				if err := os.WriteFile(path, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}},
			{name: "no-mark", mark: func(*testing.T, string) {}},
			{name: "mark-is-dir", want: "rebuild mark", mark: func(t *testing.T, path string) {
				if err := os.Mkdir(path, 0o755); err != nil {
					t.Fatal(err)
				}
			}},
		} {
			t.Run(ixo.name+"/"+tc.name, func(t *testing.T) {
				r := newRig(t, ixo, 128)
				r.open(tiers.ColdStartClear)
				pages := makePages(21, 80, 0, r.geom)
				r.putAll(pages)
				r.close()
				ix := r.ixOpen.open(t, r.ixDir)
				var drop []indexes.Key
				n := 0
				if err := ix.Iterate(context.Background(), func(e indexes.Entry) error {
					if n++; n%2 == 0 {
						drop = append(drop, e.Key)
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				if err := ix.Delete(context.Background(), drop); err != nil {
					t.Fatal(err)
				}
				if err := ix.Close(); err != nil {
					t.Fatal(err)
				}
				mark := filepath.Join(r.dir, RebuildMarkName("test", 0))
				tc.mark(t, mark)
				if tc.want != "" {
					r.index = r.ixOpen.open(t, r.ixDir)
					_, err := OpenFS(context.Background(), r.env(tiers.ColdStartLoad), r.cfg, r.fs)
					if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), mark) {
						t.Fatalf("open with %s: %v, want an error naming %q and %s", tc.name, err, tc.want, mark)
					}
					return
				}
				if tc.all {
					r.index = r.ixOpen.open(t, r.ixDir)
					rep, err := Check(context.Background(), CheckOptions{Dirs: []string{r.dir}, Index: r.index, Repair: tc.repair})
					if err != nil {
						t.Fatal(err)
					}
					if !rep.Damaged() || len(rep.Unfinished) != 1 || rep.Unfinished[0] != mark {
						t.Fatalf("check: damaged %v, unfinished %q, want the mark %s", rep.Damaged(), rep.Unfinished, mark)
					}
					if tc.repair && rep.Rebuilt.Kept != int64(len(pages)) {
						t.Fatalf("repair kept %d pages, want %d", rep.Rebuilt.Kept, len(pages))
					}
				}
				st := r.open(tiers.ColdStartLoad)
				hits := countHits(r.get(pages, 0))
				if tc.all && !tc.repair {
					if got := st.Rebuilt().Kept; got != int64(len(pages)) {
						t.Fatalf("rebuild kept %d pages, want %d", got, len(pages))
					}
				}
				if tc.all {
					if hits != len(pages) {
						t.Fatalf("%d of %d pages back after the redone rebuild", hits, len(pages))
					}
					if _, err := os.Lstat(mark); !errors.Is(err, os.ErrNotExist) {
						t.Fatalf("mark after the rebuild: %v, want it removed", err)
					}
				} else if hits != len(pages)-len(drop) {
					t.Fatalf("without the mark: %d hits, want the %d indexed pages", hits, len(pages)-len(drop))
				}
				r.checkConsistent()
			})
		}
	}
}

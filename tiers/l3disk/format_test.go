package l3disk

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// TestFormat1FileStillRead: a slab file of format version 1 (every payload
// right after its header, as builds before version 2 wrote it) is opened
// by a cold start "load" as it is: its pages read back byte for byte,
// new pages go into it in its own layout (staged, never direct), and a
// cold start "clear" then moves it to version 2, whose pages of whole
// blocks move without a staging copy.
func TestFormat1FileStillRead(t *testing.T) {
	r := newRig(t, indexByName(t, "lmdb"), 32)
	r.geom = blockGeometry
	r.slab = tiertest.NewHeapSlab(r.slabCap * r.pageSlot())
	r.open(tiers.ColdStartClear)
	kv, ix := makePages(1, 8, 0, r.geom), makePages(2, 8, 1, r.geom)
	r.putAll(kv)
	r.putAll(ix)
	paths := r.store.SlabPaths()
	r.close()
	for _, p := range paths {
		downgrade(t, p)
	}

	st := r.open(tiers.ColdStartLoad)
	for _, pages := range [][]testPage{kv, ix} {
		if h := countHits(r.get(pages, 20)); h != len(pages) {
			t.Fatalf("%d of %d pages of the version 1 file read back", h, len(pages))
		}
	}
	more := makePages(3, 4, 0, r.geom)
	r.putAll(more)
	if h := countHits(r.get(more, 20)); h != len(more) {
		t.Fatalf("%d of %d pages put into the version 1 file read back", h, len(more))
	}
	if w, rd := st.DirectTransfers(); w != 0 || rd != 0 {
		t.Fatalf("version 1 file: %d direct writes, %d direct reads; its payloads are not block-aligned", w, rd)
	}
	r.checkConsistent()
	r.close()
	if v := fileVersion(t, paths[0]); v != minFormatVersion {
		t.Fatalf("a load changed the file's version to %d", v)
	}
	// The offline check (kvtier inspect l3) verifies every slot of a
	// version 1 file in its own layout.
	r.index = r.ixOpen.open(t, r.ixDir)
	rep, err := Check(context.Background(), CheckOptions{Dirs: []string{r.dir}, Index: r.index})
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	live := int64(0)
	for _, f := range rep.Files {
		if f.Format != minFormatVersion || f.Corrupt != 0 || f.Problem != "" {
			t.Fatalf("check of the version 1 file %s: format %d, %d corrupt, problem %q", f.Path, f.Format, f.Corrupt, f.Problem)
		}
		live += f.Live
	}
	if want := int64(len(kv) + len(ix) + len(more)); live != want {
		t.Fatalf("check found %d live pages in the version 1 files, want %d", live, want)
	}

	st = r.open(tiers.ColdStartClear)
	if v := fileVersion(t, paths[0]); v != FormatVersion {
		t.Fatalf("after a clear the file is version %d, want %d", v, FormatVersion)
	}
	if h := countHits(r.get(kv, 20)); h != 0 {
		t.Fatalf("%d pages of the cleared file still hit", h)
	}
	r.putAll(kv)
	if h := countHits(r.get(kv, 20)); h != len(kv) {
		t.Fatalf("%d of %d pages read back after the clear", h, len(kv))
	}
	if w, rd := st.DirectTransfers(); w != int64(len(kv)) || rd != int64(len(kv)) {
		t.Fatalf("version 2 file: %d direct writes and %d direct reads, want %d each", w, rd, len(kv))
	}
}

// downgrade rewrites a version 2 slab file as version 1 would have
// written it: the superblock and every slot header say version 1 and
// each payload moves to right after its header.
func downgrade(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blk := make([]byte, superblockSize)
	if _, err := f.ReadAt(blk, 0); err != nil {
		t.Fatal(err)
	}
	sb, err := decodeSuperblock(blk)
	if err != nil || sb.Version != FormatVersion || PayloadOffset(sb.Version, sb.PageBytes) != diskfs.BlockSize {
		t.Fatalf("%s: superblock %+v, %v: not a version 2 file of whole-block pages", path, sb, err)
	}
	sb.Version = 1
	if err := sb.encode(blk); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(blk, 0); err != nil {
		t.Fatal(err)
	}
	moved := 0
	for slot := range sb.Slots {
		off := superblockSize + slot*sb.SlotBytes
		b := make([]byte, sb.SlotBytes)
		if _, err := f.ReadAt(b, off); err != nil {
			t.Fatal(err)
		}
		h, err := DecodeSlotHeader(b)
		if err != nil {
			continue // empty
		}
		h.Version = 1
		out := make([]byte, sb.SlotBytes)
		h.Encode(out)
		copy(out[HeaderSize:], b[diskfs.BlockSize:diskfs.BlockSize+sb.PageBytes])
		if bytes.Equal(out, b) {
			t.Fatalf("slot %d unchanged by the downgrade", slot)
		}
		if _, err := f.WriteAt(out, off); err != nil {
			t.Fatal(err)
		}
		moved++
	}
	if moved == 0 {
		t.Fatalf("%s: no slot to downgrade", path)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func fileVersion(t *testing.T, path string) uint16 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := decodeSuperblock(b)
	if err != nil {
		t.Fatal(err)
	}
	return sb.Version
}

// TestZeroCopyModes: with pages of whole blocks, "on" moves every page
// directly, "off" stages every page, and "auto" stages on a slab of 4 KiB
// pages (the heap slab here) and goes direct on one of huge pages.
func TestZeroCopyModes(t *testing.T) {
	for _, tc := range []struct {
		mode     string
		slabPage int64
		direct   bool
	}{
		{ZeroCopyOn, 4096, true},
		{ZeroCopyOff, 4096, false},
		{ZeroCopyOff, 2 << 20, false},
		{ZeroCopyAuto, 4096, false},
		{ZeroCopyAuto, 2 << 20, true},
	} {
		t.Run(fmt.Sprintf("%s/slab-page-%d", tc.mode, tc.slabPage), func(t *testing.T) {
			r := newRig(t, indexByName(t, "lmdb"), 16)
			r.geom = blockGeometry
			heap := tiertest.NewHeapSlab(r.slabCap * r.pageSlot())
			r.slab = heap
			r.cfg.ZeroCopy = tc.mode
			st := r.openSlab(pageSized{heap, tc.slabPage})
			pages := makePages(5, 6, 0, r.geom)
			r.putAll(pages)
			if h := countHits(r.get(pages, 10)); h != len(pages) {
				t.Fatalf("%d of %d hit", h, len(pages))
			}
			w, rd := st.DirectTransfers()
			if want := int64(len(pages)); tc.direct && (w != want || rd != want) || !tc.direct && (w != 0 || rd != 0) {
				t.Fatalf("direct writes %d, reads %d; want direct %v for %d pages", w, rd, tc.direct, len(pages))
			}
		})
	}
}

// pageSized is a heap slab that reports another page size, standing for
// a slab in huge pages (the store reads only the geometry's page size).
type pageSized struct {
	*tiertest.HeapSlab
	page int64
}

func (p pageSized) Geometry() tiers.SlabGeometry {
	g := p.HeapSlab.Geometry()
	g.PageSize = p.page
	return g
}

// openSlab opens the store (cold start clear) over sl instead of r.slab;
// r.slab stays the memory the rig's put and get use (sl must show it).
func (r *rig) openSlab(sl tiers.Slab) *Store {
	r.t.Helper()
	if r.index == nil {
		r.index = r.ixOpen.open(r.t, r.ixDir)
	}
	env := r.env(tiers.ColdStartClear)
	env.Slab = sl
	st, err := OpenFS(context.Background(), env, r.cfg, r.fs)
	if err != nil {
		r.t.Fatalf("open store: %v", err)
	}
	r.store = st
	r.t.Cleanup(func() { r.close() })
	return st
}

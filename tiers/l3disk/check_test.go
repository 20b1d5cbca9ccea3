package l3disk

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/tiers"
)

// TestCheck damages a closed store in each way inspect reports — a
// corrupt payload, a dangling entry, an orphan, a stale entry — and checks
// the counts, the repair, and a clean second pass.
func TestCheck(t *testing.T) {
	r := newRig(t, testIndexes()[0], 16)
	st := r.open(tiers.ColdStartClear)
	pages := makePages(1, 6, 0, r.geom)
	r.put(pages, 0)
	r.put(makePages(2, 3, 1, r.geom), 8)
	if _, err := Check(context.Background(), CheckOptions{Dirs: []string{r.dir}, Index: r.index}); !errors.Is(err, ErrInUse) {
		t.Fatalf("check of an open store: %v, want ErrInUse", err)
	}
	epoch, path := st.files[0].epoch(), st.files[0].path
	var rec0 indexes.Record
	recs, found := make([]indexes.Record, 1), make([]bool, 1)
	if err := r.index.Get(context.Background(), []indexes.Key{pages[0].key.IndexKey()}, recs, found); err != nil || !found[0] {
		t.Fatalf("get record: %v", err)
	}
	rec0 = recs[0]
	r.store.Close()
	r.store = nil

	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Corrupt the payload of pages[0].
	off := superblockSize + int64(rec0.Slot)*SlotBytes(20000) + HeaderSize + 123
	b := []byte{0}
	f.ReadAt(b, off)
	b[0] ^= 0xff
	f.WriteAt(b, off)
	// An orphan in slot 15.
	orphan := makePages(3, 1, 0, r.geom)[0]
	buf := make([]byte, SlotBytes(20000))
	copy(buf[HeaderSize:], orphan.data)
	SlotHeader{Kind: 0, Epoch: epoch, Hash: orphan.key.Hash, PayloadLen: 20000, PayloadCRC: PayloadCRC(orphan.data)}.Encode(buf)
	f.WriteAt(buf, superblockSize+15*SlotBytes(20000))
	f.Close()
	ctx := context.Background()
	// A dangling entry (slot 14 was never written) and a stale one.
	dangling, stale := makePages(4, 2, 0, r.geom), makePages(5, 1, 0, r.geom)
	if err := r.index.Put(ctx, []indexes.Entry{
		{Key: dangling[0].key.IndexKey(), Record: indexes.Record{Disk: 0, Kind: 0, Slot: 14, Epoch: epoch}},
		{Key: dangling[1].key.IndexKey(), Record: indexes.Record{Disk: 0, Kind: 0, Slot: 99, Epoch: epoch}},
		{Key: stale[0].key.IndexKey(), Record: indexes.Record{Disk: 0, Kind: 0, Slot: 3, Epoch: epoch - 1<<16}},
		{Key: stale[0].key.IndexKey(), Record: indexes.Record{Disk: 0, Kind: 0, Slot: 3, Epoch: epoch - 1<<16}},
	}); err != nil {
		t.Fatal(err)
	}
	rep, err := Check(ctx, CheckOptions{Dirs: []string{r.dir}, Index: r.index})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Live != 5+3 || rep.Corrupt != 1 || rep.Orphan != 1 || rep.Dangling != 2 || rep.Stale != 1 || !rep.Damaged() || len(rep.Files) != 2 {
		t.Fatalf("report %+v", rep)
	}
	if rep.Live+rep.Orphan+rep.Corrupt+rep.Free != 32 {
		t.Fatalf("slot counts do not add up to 32: %+v", rep)
	}
	rep, err = Check(ctx, CheckOptions{Dirs: []string{r.dir}, Index: r.index, Repair: true})
	if err != nil || rep.Repaired != 4 {
		t.Fatalf("repair: %+v, %v; want 4 repaired", rep, err)
	}
	rep, err = Check(ctx, CheckOptions{Dirs: []string{r.dir}, Index: r.index})
	if err != nil || rep.Damaged() || rep.Stale != 0 || rep.Live != 8 {
		t.Fatalf("after repair: %+v, %v", rep, err)
	}
	// And the store loads it cleanly.
	r.open(tiers.ColdStartLoad)
	if h := countHits(r.get(pages, 8)); h != 5 {
		t.Fatalf("%d of 5 intact pages hit after repair", h)
	}
	r.checkConsistent()
}

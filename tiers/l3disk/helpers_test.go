package l3disk

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/badger"
	"github.com/kvtier/kvtier/indexes/lmdb"
	"github.com/kvtier/kvtier/internal/crc32c"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// testGeometry has two kinds with page sizes that are not multiples of
// 4 KiB, so slot padding and alignment are exercised.
var testGeometry = tiers.PayloadGeometry{
	PageTokens: 16,
	Kinds: []tiers.PayloadSpec{
		{Name: "kv", PageBytes: 20000},
		{Name: "index", PageBytes: 5000},
	},
}

// blockGeometry has two kinds of whole 4 KiB blocks: their payloads sit
// one block into the slot and move between the disk and the slab span
// directly (no staging copy).
var blockGeometry = tiers.PayloadGeometry{
	PageTokens: 16,
	Kinds: []tiers.PayloadSpec{
		{Name: "kv", PageBytes: 16384},
		{Name: "index", PageBytes: 8192},
	},
}

// layout is a slot layout the store's tests run over: a geometry and a
// zero_copy mode.
type layout struct {
	name     string
	geom     tiers.PayloadGeometry
	zeroCopy string
}

// layouts: ragged pages (the payload right after the header, staged),
// pages of whole blocks moved directly, and the same pages staged.
func layouts() []layout {
	return []layout{
		{"ragged", testGeometry, ZeroCopyOn},
		{"blocks", blockGeometry, ZeroCopyOn},
		{"blocks-staged", blockGeometry, ZeroCopyOff},
	}
}

// checkDirect fails the test unless the store moved payloads without a
// staging copy exactly when the layout allows it: pages of whole blocks
// (every kind of the geometries here), block-aligned spans (the heap
// slab's large allocation and its page-multiple offsets are).
func (r *rig) checkDirect() {
	r.t.Helper()
	w, rd := r.store.DirectTransfers()
	blocks := r.cfg.ZeroCopy == ZeroCopyOn
	for _, k := range r.geom.Kinds {
		blocks = blocks && k.PageBytes%diskfs.BlockSize == 0
	}
	if blocks != (w > 0) || !blocks && rd > 0 {
		r.t.Fatalf("direct writes %d, reads %d, for pages of whole blocks %v", w, rd, blocks)
	}
}

// indexOpener opens an index in dir; the test registers cleanup.
type indexOpener struct {
	name string
	open func(t testing.TB, dir string) indexes.Index
}

func openBadger(t testing.TB, dir string) indexes.Index {
	t.Helper()
	cfg := badger.DefaultConfig()
	cfg.Dir = dir
	cfg.Sync = false
	cfg.MemTableBytes = 16 << 20
	cfg.BlockCacheBytes = 1 << 20
	ix, err := badger.Open(context.Background(), indexes.Env{Logger: testLogger(t), Dir: dir}, cfg)
	if err != nil {
		t.Fatalf("open badger index in %s: %v", dir, err)
	}
	return ix
}

func openLMDB(t testing.TB, dir string) indexes.Index {
	t.Helper()
	cfg := lmdb.DefaultConfig()
	cfg.Dir = dir
	cfg.MapSizeBytes = 64 << 20
	cfg.Sync = lmdb.SyncNone // survives SIGKILL; power loss is not under test
	ix, err := lmdb.Open(context.Background(), indexes.Env{Logger: testLogger(t), Dir: dir}, cfg)
	if err != nil {
		t.Fatalf("open lmdb index in %s: %v", dir, err)
	}
	return ix
}

// testIndexes lists the real indexes the store's tests run over.
func testIndexes() []indexOpener {
	return []indexOpener{{"badger", openBadger}, {"lmdb", openLMDB}}
}

func indexByName(t testing.TB, name string) indexOpener {
	for _, ix := range testIndexes() {
		if ix.name == name {
			return ix
		}
	}
	t.Fatalf("no test index %q", name)
	return indexOpener{}
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// rig is one store under test with its slab, index and directories.
type rig struct {
	t       testing.TB
	dir     string // disk directory
	ixDir   string
	ixOpen  indexOpener
	index   indexes.Index
	slab    *tiertest.HeapSlab
	cfg     Config
	geom    tiers.PayloadGeometry
	store   *Store
	fs      diskfs.FS
	slabCap int64
	sums    bool // put passes each page's CRC-32C as the producer's (PutRequest.Sum)
}

func testConfig(dir string, slots int64) Config {
	c := DefaultConfig()
	c.Disks = []Disk{{Dir: dir}}
	c.Slots = slots
	c.Depth = 4
	c.PLPProbes = 0
	// NB: the tests' heap slab is in 4 KiB pages, where auto stages every
	// page: on, so the direct path is what the whole-block geometries test.
	c.ZeroCopy = ZeroCopyOn
	return c
}

func newRig(t testing.TB, ix indexOpener, slots int64) *rig {
	t.Helper()
	base := t.TempDir()
	r := &rig{
		t: t, dir: filepath.Join(base, "disk0"), ixDir: filepath.Join(base, "index"), ixOpen: ix,
		geom: testGeometry, fs: diskfs.OS{}, slabCap: 256,
	}
	r.cfg = testConfig(r.dir, slots)
	r.slab = tiertest.NewHeapSlab(r.slabCap * r.pageSlot())
	return r
}

// pageSlot is the slab stride: the largest page.
func (r *rig) pageSlot() int64 {
	m := int64(0)
	for _, k := range r.geom.Kinds {
		m = max(m, k.PageBytes)
	}
	return m
}

func (r *rig) env(mode tiers.ColdStart) tiers.Env {
	return tiers.Env{
		Logger: testLogger(r.t), Payload: r.geom, Rank: 0, WorldSize: 1, StackID: "test",
		Slab: r.slab, ColdStart: mode, Index: r.index,
	}
}

// open opens index (if closed) and store with the given cold start.
func (r *rig) open(mode tiers.ColdStart) *Store {
	r.t.Helper()
	if r.index == nil {
		r.index = r.ixOpen.open(r.t, r.ixDir)
	}
	st, err := OpenFS(context.Background(), r.env(mode), r.cfg, r.fs)
	if err != nil {
		r.t.Fatalf("open store (%s): %v", mode, err)
	}
	r.store = st
	r.t.Cleanup(func() { r.close() })
	return st
}

// close closes store and index.
func (r *rig) close() {
	r.t.Helper()
	if r.store != nil {
		if err := r.store.Close(); err != nil && !errors.Is(err, tiers.ErrClosed) {
			r.t.Errorf("close store: %v", err)
		}
		r.store = nil
	}
	if r.index != nil {
		if err := r.index.Close(); err != nil && !errors.Is(err, indexes.ErrClosed) {
			r.t.Errorf("close index: %v", err)
		}
		r.index = nil
	}
}

// testPage is a page the tests write and expect back.
type testPage struct {
	key  tiers.Key
	data []byte
}

func makePages(seed uint64, n int, kind tiers.PayloadKind, g tiers.PayloadGeometry) []testPage {
	rng := rand.New(rand.NewPCG(seed, 77))
	out := make([]testPage, n)
	size := g.Kinds[kind].PageBytes
	for i := range out {
		var h pagehash.Hash
		for j := 0; j < len(h); j += 8 {
			binary.LittleEndian.PutUint64(h[j:], rng.Uint64())
		}
		d := make([]byte, size)
		for j := range d {
			d[j] = byte(rng.Uint32())
		}
		out[i] = testPage{key: tiers.Key{Hash: h, Kind: kind}, data: d}
	}
	return out
}

func (r *rig) span(i int, k tiers.PayloadKind) tiers.Span {
	return tiers.Span{Offset: int64(i) * r.pageSlot(), Length: r.geom.Kinds[k].PageBytes}
}

// put stores pages through slab slots base.. and returns each item's
// terminal error.
func (r *rig) put(pages []testPage, base int) []error {
	r.t.Helper()
	reqs := make([]tiers.PutRequest, len(pages))
	for i, p := range pages {
		sp := r.span(base+i, p.key.Kind)
		b, err := r.slab.Bytes(sp)
		if err != nil {
			r.t.Fatal(err)
		}
		copy(b, p.data)
		reqs[i] = tiers.PutRequest{Key: p.key, Src: sp}
		if r.sums {
			reqs[i].Sum, reqs[i].HasSum = crc32c.Checksum(p.data), true
		}
	}
	id, err := r.store.Put(context.Background(), reqs)
	if err != nil {
		r.t.Fatalf("put: %v", err)
	}
	return r.waitBatch(id, len(pages))
}

func (r *rig) waitBatch(id tiers.BatchID, n int) []error {
	r.t.Helper()
	out := make([]error, n)
	left := n
	// The ack protocol: at most one AckGathered an item, before its
	// AckDurable (an AckFailed may come without one); one terminal ack.
	gathered, ended := make([]bool, n), make([]bool, n)
	deadline := time.Now().Add(30 * time.Second)
	for left > 0 {
		for _, a := range r.store.DrainAcks(nil) {
			if a.Batch != id {
				r.t.Fatalf("ack of unexpected batch %d", a.Batch)
			}
			if a.Index < 0 || a.Index >= n || ended[a.Index] {
				r.t.Fatalf("ack %+v: no such item, or after its terminal ack", a)
			}
			switch a.Stage {
			case tiers.AckGathered:
				if gathered[a.Index] {
					r.t.Fatalf("item %d gathered twice", a.Index)
				}
				gathered[a.Index] = true
			case tiers.AckDurable:
				if !gathered[a.Index] {
					r.t.Fatalf("item %d durable before it was gathered", a.Index)
				}
				ended[a.Index] = true
				left--
			case tiers.AckFailed:
				out[a.Index] = a.Err
				ended[a.Index] = true
				left--
			}
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("timed out waiting for %d acks of batch %d", left, id)
		}
		select {
		case <-r.store.AckReady():
		case <-time.After(5 * time.Millisecond):
		}
	}
	return out
}

// get reads pages into slab slots base.. and checks that every hit is
// byte-exact and every miss wraps ErrMiss.
func (r *rig) get(pages []testPage, base int) []error {
	r.t.Helper()
	reqs := make([]tiers.GetRequest, len(pages))
	for i, p := range pages {
		sp := r.span(base+i, p.key.Kind)
		b, _ := r.slab.Bytes(sp)
		for j := range b {
			b[j] = 0xEE
		}
		reqs[i] = tiers.GetRequest{Key: p.key, Dst: sp}
	}
	res := make([]error, len(pages))
	if err := r.store.Get(context.Background(), reqs, res); err != nil {
		r.t.Fatalf("get: %v", err)
	}
	for i, p := range pages {
		if res[i] == nil {
			b, _ := r.slab.Bytes(reqs[i].Dst)
			if !bytes.Equal(b, p.data) {
				r.t.Fatalf("get %s: hit with WRONG BYTES", p.key)
			}
		} else if !errors.Is(res[i], tiers.ErrMiss) {
			r.t.Fatalf("get %s: result %v does not wrap ErrMiss", p.key, res[i])
		}
	}
	return res
}

// checkGetSums gets pages and returns how many hits came back with
// HasSum set; a hit's Sum other than the CRC-32C of its bytes, or a miss
// with HasSum, fails the test.
func (r *rig) checkGetSums(pages []testPage) int {
	r.t.Helper()
	reqs := make([]tiers.GetRequest, len(pages))
	for i, p := range pages {
		reqs[i] = tiers.GetRequest{Key: p.key, Dst: r.span(i, p.key.Kind)}
	}
	res := make([]error, len(pages))
	if err := r.store.Get(context.Background(), reqs, res); err != nil {
		r.t.Fatalf("get: %v", err)
	}
	n := 0
	for i, p := range pages {
		switch {
		case res[i] != nil && reqs[i].HasSum:
			r.t.Fatalf("get %s: a miss with a sum", p.key)
		case res[i] == nil && reqs[i].HasSum:
			if want := crc32c.Checksum(p.data); reqs[i].Sum != want {
				r.t.Fatalf("get %s: sum %#x, the page's CRC-32C is %#x", p.key, reqs[i].Sum, want)
			}
			n++
		}
	}
	return n
}

func countHits(res []error) int {
	n := 0
	for _, e := range res {
		if e == nil {
			n++
		}
	}
	return n
}

// onWriter runs fn on the store's writer goroutine once nothing is queued
// or in flight, and returns fn's error.
func onWriter(t testing.TB, s *Store, fn func() error) error {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		done := make(chan error, 1)
		s.postCtl(ctlOp{kind: ctlCall, fn: func() {
			s.gatherMu.Lock()
			q := len(s.gatherQ)
			s.gatherMu.Unlock()
			if q > 0 || len(s.gathered) > 0 || s.inflightN > 0 || len(s.staging) != cap(s.staging) {
				done <- errBusy
				return
			}
			done <- fn()
		}})
		select {
		case err := <-done:
			if err != errBusy {
				return err
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("writer did not answer in 20s")
		}
		if time.Now().After(deadline) {
			t.Fatalf("store not idle after 20s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

var errBusy = errors.New("busy")

// checkConsistent checks, on the writer goroutine with nothing in flight,
// slot pools, the index and each other: every index entry of this store
// points at a live slot holding its hash, every live slot is indexed
// exactly once, and free + live = total (no slot leaks).
func (r *rig) checkConsistent() {
	r.t.Helper()
	s := r.store
	err := onWriter(r.t, s, func() error {
		refs := make([]map[int32]pagehash.Hash, len(s.files))
		for k := range refs {
			refs[k] = map[int32]pagehash.Hash{}
		}
		err := s.index.Iterate(context.Background(), func(e indexes.Entry) error {
			if !s.ownsRecord(e.Key, e.Record) || e.Record.Epoch != s.files[e.Key.Kind].epoch() {
				return nil
			}
			slot := int32(e.Record.Slot)
			if _, dup := refs[e.Key.Kind][slot]; dup {
				return fmt.Errorf("slot %d of kind %d referenced twice", slot, e.Key.Kind)
			}
			refs[e.Key.Kind][slot] = e.Key.Hash
			return nil
		})
		if err != nil {
			return fmt.Errorf("iterate: %w", err)
		}
		for k, p := range s.pools {
			if err := p.check(); err != nil {
				return fmt.Errorf("kind %d pool: %w", k, err)
			}
			if p.used() != p.live || p.freeCount()+p.live != p.size() {
				return fmt.Errorf("kind %d: %d free + %d live + %d in flight != %d slots", k, p.freeCount(), p.live, p.used()-p.live, p.size())
			}
			for slot, h := range refs[k] {
				if p.state[slot] != slotLive || p.hash[slot] != h {
					return fmt.Errorf("kind %d: index maps %s to slot %d, pool has it %s with %s", k, h.Short(), slot, p.state[slot], p.hash[slot].Short())
				}
			}
			if len(refs[k]) != p.live {
				return fmt.Errorf("kind %d: %d index entries, %d live slots", k, len(refs[k]), p.live)
			}
			if got := s.st.usedSlots[k].Load(); got != int64(p.used()) {
				return fmt.Errorf("kind %d: used-slots gauge %d, pool %d", k, got, p.used())
			}
		}
		return nil
	})
	if err != nil {
		r.t.Fatalf("consistency: %v", err)
	}
}

// Package tiertest is the conformance suite of kvtier's tier roles. Any
// implementation of Store v1 — in-process or a plugin binary, ours or a third
// party's — runs it unchanged:
//
//	func TestConformance(t *testing.T) {
//		tiertest.RunStore(t, tiertest.StoreHarness{Payload: g, Open: open})
//	}
//
// The suite checks the contract written in tiers/store.go: byte-exact hits,
// misses that wrap tiers.ErrMiss, the ack protocol (at most one gathered,
// exactly one terminal ack per item), reuse of source spans after the
// gathered ack, malformed requests refused whole with tiers.ErrInvalid,
// closed stores answering tiers.ErrClosed, concurrency, puts that carry the
// producer's checksum (PutRequest.Sum; a tiers.SumKeeper must turn a source
// changed after its sum into a miss), and, where the harness can reopen the
// store, durability across a restart.
package tiertest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/internal/crc32c"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

// StoreHarness tells the suite how to open the store under test.
type StoreHarness struct {
	// Payload is the payload geometry the store is opened with. Use at least
	// two kinds and page sizes that are not powers of two to catch
	// alignment assumptions; keep them small (tens of KiB).
	Payload tiers.PayloadGeometry
	// Open returns a fresh, empty store and the slab it reads and writes
	// through. The slab must hold at least SlabPages pages of the largest
	// payload in its first slab. Cleanup is the harness's (t.Cleanup); the
	// suite closes the store itself in some subtests, so Close must be
	// safe to call twice.
	Open func(t *testing.T) (tiers.Store, tiers.Slab)
	// Reopen, if set, closes nothing and opens the same store again over
	// the same data, as after a restart with cold start "load", returning
	// it with a slab. The suite closes the first store before calling it.
	// Nil for stores that are not persistent.
	Reopen func(t *testing.T) (tiers.Store, tiers.Slab)
	// CapacityPages, if positive, is roughly how many pages of the largest
	// payload the store holds; the suite then overfills it threefold and
	// checks that every item still terminates and every hit is exact.
	CapacityPages int
	// AckTimeout bounds waiting for acks (default 20s).
	AckTimeout time.Duration
}

// SlabPages is the number of payload pages of slab space the suite uses.
const SlabPages = 64

// RunStore runs the Store v1 conformance suite.
func RunStore(t *testing.T, h StoreHarness) {
	t.Helper()
	if h.Open == nil || len(h.Payload.Kinds) == 0 {
		t.Fatal("tiertest: harness needs Open and a payload geometry")
	}
	if h.AckTimeout == 0 {
		h.AckTimeout = 20 * time.Second
	}
	tests := []struct {
		name string
		run  func(t *testing.T, h StoreHarness)
	}{
		{"EmptyMisses", testEmptyMisses},
		{"PutGetExact", testPutGetExact},
		{"AckProtocol", testAckProtocol},
		{"SourceReusableAfterGathered", testSourceReuse},
		{"ProducerSums", testProducerSums},
		{"KindsAreDistinct", testKindsDistinct},
		{"IdempotentPut", testIdempotentPut},
		{"LongestPrefix", testLongestPrefix},
		{"DeleteAndTouch", testDeleteTouch},
		{"EmptyBatches", testEmptyBatches},
		{"MalformedRequests", testMalformed},
		{"Concurrent", testConcurrent},
		{"Capacity", testCapacity},
		{"Closed", testClosed},
		{"Durable", testDurable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, h) })
	}
}

// page is one payload page the suite writes and expects back.
type page struct {
	key  tiers.Key
	data []byte
}

// fixture lays pages out in the slab: page i of the batch at slot i.
type fixture struct {
	h     StoreHarness
	store tiers.Store
	slab  tiers.Slab
	slot  int64 // bytes per slot: the largest page size
}

func newFixture(t *testing.T, h StoreHarness) *fixture {
	t.Helper()
	st, sl := h.Open(t)
	return attach(t, h, st, sl)
}

func attach(t *testing.T, h StoreHarness, st tiers.Store, sl tiers.Slab) *fixture {
	t.Helper()
	f := &fixture{h: h, store: st, slab: sl}
	for _, k := range h.Payload.Kinds {
		f.slot = max(f.slot, k.PageBytes)
	}
	g := sl.Geometry()
	if len(g.Slabs) == 0 || g.Slabs[0].Size < 2*SlabPages*f.slot {
		t.Fatalf("tiertest: slab 0 must hold %d bytes (2 x %d pages of %d), geometry %+v", 2*SlabPages*f.slot, SlabPages, f.slot, g)
	}
	return f
}

// span returns the span of slot i (0 <= i < 2*SlabPages) for kind k.
func (f *fixture) span(i int, k tiers.PayloadKind) tiers.Span {
	n, _ := f.h.Payload.PageBytes(k)
	return tiers.Span{Slab: 0, Offset: int64(i) * f.slot, Length: n}
}

func (f *fixture) bytes(t *testing.T, sp tiers.Span) []byte {
	t.Helper()
	b, err := f.slab.Bytes(sp)
	if err != nil {
		t.Fatalf("slab bytes %+v: %v", sp, err)
	}
	return b
}

// makePages returns n pages of kind k whose hashes form a chain seeded by
// seed and whose bytes are derived from the key (so any mix-up shows).
func (f *fixture) makePages(seed uint64, n int, k tiers.PayloadKind) []page {
	size, _ := f.h.Payload.PageBytes(k)
	out := make([]page, n)
	prev := pagehash.Root
	for i := range out {
		var tok [2]uint32
		tok[0], tok[1] = uint32(seed), uint32(seed>>32)+uint32(i)
		prev = pagehash.Next(prev, tok[:])
		key := tiers.Key{Hash: prev, Kind: k}
		out[i] = page{key: key, data: content(key, size)}
	}
	return out
}

// content derives page bytes from a key.
func content(k tiers.Key, size int64) []byte {
	b := make([]byte, size)
	seed := binary.LittleEndian.Uint64(k.Hash[:8]) ^ uint64(k.Kind)<<56
	r := rand.New(rand.NewPCG(seed, 0x6b767469))
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

// put writes pages into slots base.. and stores them, waiting for all
// terminal acks. It returns the terminal error of each item.
func (f *fixture) put(t *testing.T, base int, pages []page) []error {
	t.Helper()
	reqs := make([]tiers.PutRequest, len(pages))
	for i, p := range pages {
		sp := f.span(base+i, p.key.Kind)
		copy(f.bytes(t, sp), p.data)
		reqs[i] = tiers.PutRequest{Key: p.key, Src: sp}
	}
	id, err := f.store.Put(context.Background(), reqs)
	if err != nil {
		t.Fatalf("put %d pages: %v", len(pages), err)
	}
	acks := waitAcks(t, f.store, map[tiers.BatchID]int{id: len(pages)}, f.h.AckTimeout)
	out := make([]error, len(pages))
	for _, a := range acks[id] {
		if a.Stage == tiers.AckFailed {
			out[a.Index] = a.Err
		}
	}
	return out
}

// putOK is put that fails the test on any failed item.
func (f *fixture) putOK(t *testing.T, base int, pages []page) {
	t.Helper()
	for i, err := range f.put(t, base, pages) {
		if err != nil {
			t.Fatalf("put item %d (%s): %v", i, pages[i].key, err)
		}
	}
}

// get reads pages into slots base.. and returns the per-item results after
// checking that every hit is byte-exact.
func (f *fixture) get(t *testing.T, base int, pages []page) []error {
	t.Helper()
	reqs := make([]tiers.GetRequest, len(pages))
	for i, p := range pages {
		sp := f.span(base+i, p.key.Kind)
		clear(f.bytes(t, sp))
		reqs[i] = tiers.GetRequest{Key: p.key, Dst: sp}
	}
	res := make([]error, len(pages))
	if err := f.store.Get(context.Background(), reqs, res); err != nil {
		t.Fatalf("get %d pages: %v", len(pages), err)
	}
	for i, p := range pages {
		if res[i] == nil {
			if got := f.bytes(t, reqs[i].Dst); !bytes.Equal(got, p.data) {
				t.Fatalf("get item %d (%s): hit with wrong bytes (first difference at %d)", i, p.key, firstDiff(got, p.data))
			}
			// A sum handed back (GetRequest.HasSum) is the CRC-32C of the
			// bytes the hit left in Dst.
			if reqs[i].HasSum && reqs[i].Sum != crc32c.Checksum(p.data) {
				t.Fatalf("get item %d (%s): hit with sum %#x, its bytes' CRC-32C is %#x", i, p.key, reqs[i].Sum, crc32c.Checksum(p.data))
			}
		} else if reqs[i].HasSum {
			t.Fatalf("get item %d (%s): a miss with a sum", i, p.key)
		} else if !errors.Is(res[i], tiers.ErrMiss) {
			t.Fatalf("get item %d (%s): per-item error %v does not wrap tiers.ErrMiss", i, p.key, res[i])
		}
	}
	return res
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// waitAcks drains acks until every batch in want has want[id] terminal
// acks, checking the protocol as it goes.
func waitAcks(t *testing.T, st tiers.Store, want map[tiers.BatchID]int, timeout time.Duration) map[tiers.BatchID][]tiers.Ack {
	t.Helper()
	got := make(map[tiers.BatchID][]tiers.Ack)
	type item struct {
		b tiers.BatchID
		i int
	}
	gathered := make(map[item]bool)
	terminal := make(map[item]bool)
	left := 0
	for _, n := range want {
		left += n
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var buf []tiers.Ack
	for left > 0 {
		buf = st.DrainAcks(buf[:0])
		for _, a := range buf {
			n, ok := want[a.Batch]
			if !ok {
				t.Fatalf("ack for unknown batch %d: %+v", a.Batch, a)
			}
			if a.Index < 0 || a.Index >= n {
				t.Fatalf("ack index %d out of range for batch %d of %d items", a.Index, a.Batch, n)
			}
			it := item{a.Batch, a.Index}
			if terminal[it] {
				t.Fatalf("ack %+v after the item's terminal ack", a)
			}
			switch a.Stage {
			case tiers.AckGathered:
				if gathered[it] {
					t.Fatalf("second gathered ack for batch %d item %d", a.Batch, a.Index)
				}
				if a.Err != nil {
					t.Fatalf("gathered ack with error: %+v", a)
				}
				gathered[it] = true
			case tiers.AckDurable:
				if !gathered[it] {
					t.Fatalf("durable ack before gathered for batch %d item %d", a.Batch, a.Index)
				}
				if a.Err != nil {
					t.Fatalf("durable ack with error: %+v", a)
				}
				terminal[it] = true
				left--
			case tiers.AckFailed:
				if a.Err == nil {
					t.Fatalf("failed ack without error: %+v", a)
				}
				terminal[it] = true
				left--
			default:
				t.Fatalf("ack with unknown stage: %+v", a)
			}
			got[a.Batch] = append(got[a.Batch], a)
		}
		if left == 0 {
			break
		}
		select {
		case <-st.AckReady():
		case <-time.After(5 * time.Millisecond):
			// NB: AckReady is a wake-up hint; polling as well keeps a
			// store that signals before queueing from hanging the suite.
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %d terminal acks", timeout, left)
		}
	}
	return got
}

func allMiss(t *testing.T, what string, res []error) {
	t.Helper()
	for i, err := range res {
		if err == nil {
			t.Fatalf("%s: item %d hit, want miss", what, i)
		}
	}
}

func allHit(t *testing.T, what string, res []error) {
	t.Helper()
	for i, err := range res {
		if err != nil {
			t.Fatalf("%s: item %d: %v, want hit", what, i, err)
		}
	}
}

func testEmptyMisses(t *testing.T, h StoreHarness) {
	f := newFixture(t, h)
	pages := f.makePages(1, 8, 0)
	allMiss(t, "get from empty store", f.get(t, 0, pages))
	chain := make([]pagehash.Hash, len(pages))
	for i, p := range pages {
		chain[i] = p.key.Hash
	}
	n, err := f.store.LongestPrefix(context.Background(), 0, chain)
	if err != nil || n != 0 {
		t.Fatalf("longest prefix on empty store = %d, %v; want 0, nil", n, err)
	}
}

func testPutGetExact(t *testing.T, h StoreHarness) {
	f := newFixture(t, h)
	for k := range h.Payload.Kinds {
		pages := f.makePages(uint64(10+k), 16, tiers.PayloadKind(k))
		f.putOK(t, 0, pages)
		allHit(t, fmt.Sprintf("get kind %d", k), f.get(t, SlabPages, pages))
		// Reading into different slots, in reverse order, must still be exact.
		rev := make([]page, len(pages))
		for i := range pages {
			rev[i] = pages[len(pages)-1-i]
		}
		allHit(t, "get reversed", f.get(t, 3, rev))
	}
	st := f.store.Stats()
	if st.Pages < 1 || st.Hits < 1 {
		t.Fatalf("stats after puts and hits: %+v", st)
	}
}

func testAckProtocol(t *testing.T, h StoreHarness) {
	f := newFixture(t, h)
	// Several batches in flight at once; waitAcks checks the protocol.
	want := make(map[tiers.BatchID]int)
	var last tiers.BatchID
	for b := range 4 {
		pages := f.makePages(uint64(100+b), 8, 0)
		reqs := make([]tiers.PutRequest, len(pages))
		for i, p := range pages {
			sp := f.span(b*8+i, 0)
			copy(f.bytes(t, sp), p.data)
			reqs[i] = tiers.PutRequest{Key: p.key, Src: sp}
		}
		id, err := f.store.Put(context.Background(), reqs)
		if err != nil {
			t.Fatalf("put batch %d: %v", b, err)
		}
		if id <= last {
			t.Fatalf("batch ids must increase: got %d after %d", id, last)
		}
		last = id
		want[id] = len(pages)
	}
	acks := waitAcks(t, f.store, want, h.AckTimeout)
	for id, n := range want {
		durable := 0
		for _, a := range acks[id] {
			if a.Stage == tiers.AckDurable {
				durable++
			}
		}
		if durable != n {
			t.Fatalf("batch %d: %d durable acks, want %d", id, durable, n)
		}
	}
	if rest := f.store.DrainAcks(nil); len(rest) != 0 {
		t.Fatalf("acks after every item terminated: %+v", rest)
	}
}

func testSourceReuse(t *testing.T, h StoreHarness) {
	f := newFixture(t, h)
	pages := f.makePages(7, 16, 0)
	reqs := make([]tiers.PutRequest, len(pages))
	for i, p := range pages {
		sp := f.span(i, 0)
		copy(f.bytes(t, sp), p.data)
		reqs[i] = tiers.PutRequest{Key: p.key, Src: sp}
	}
	id, err := f.store.Put(context.Background(), reqs)
	if err != nil {
		t.Fatalf("put: %v", err)
	}
	// Scribble over each source span as soon as its gathered ack arrives,
	// as a host reusing slab pages would.
	deadline := time.Now().Add(h.AckTimeout)
	done := 0
	for done < len(pages) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for acks")
		}
		for _, a := range f.store.DrainAcks(nil) {
			if a.Batch != id {
				t.Fatalf("ack for unexpected batch: %+v", a)
			}
			switch a.Stage {
			case tiers.AckGathered:
				b := f.bytes(t, reqs[a.Index].Src)
				for i := range b {
					b[i] = 0xA5
				}
			case tiers.AckDurable:
				done++
			case tiers.AckFailed:
				t.Fatalf("put item %d failed: %v", a.Index, a.Err)
			}
		}
		time.Sleep(time.Millisecond)
	}
	allHit(t, "get after source reuse", f.get(t, SlabPages, pages))
}

// castagnoli is the oracle for PutRequest.Sum: the standard library's
// CRC-32C, independent of the stores' own.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// testProducerSums puts pages with and without the producer's checksum.
// Every store must read back a put with a correct sum exactly (a store
// that predates the field ignores it). A tiers.SumKeeper must also store
// the sum as given: a source changed after its sum was taken (the "no
// laundering" property) reads back as a miss, never as the changed bytes
// nor the original ones.
func testProducerSums(t *testing.T, h StoreHarness) {
	cases := []struct {
		name string
		// sum says whether the put carries a sum; changed flips a byte of
		// the source after the sum was taken.
		sum, changed bool
		keeperOnly   bool
		wantHit      bool
	}{
		{name: "no sum", wantHit: true},
		{name: "correct sum", sum: true, wantHit: true},
		{name: "source changed after the sum", sum: true, changed: true, keeperOnly: true},
	}
	for ci, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, h)
			if sk, ok := f.store.(tiers.SumKeeper); c.keeperOnly && (!ok || !sk.KeepsPutSums()) {
				t.Skip("the store does not keep producer sums (tiers.SumKeeper): the host checks the slab at AckGathered instead")
			}
			var pages []page
			for k := range h.Payload.Kinds {
				pages = append(pages, f.makePages(uint64(900+10*ci+k), 4, tiers.PayloadKind(k))...)
			}
			reqs := make([]tiers.PutRequest, len(pages))
			for i, p := range pages {
				sp := f.span(i, p.key.Kind)
				b := f.bytes(t, sp)
				copy(b, p.data)
				reqs[i] = tiers.PutRequest{Key: p.key, Src: sp}
				if c.sum {
					reqs[i].Sum, reqs[i].HasSum = crc32.Checksum(p.data, castagnoli), true
				}
				if c.changed {
					b[(i*131)%len(b)] ^= 0x40 // a client writing after the producer's sum
				}
			}
			id, err := f.store.Put(context.Background(), reqs)
			if err != nil {
				t.Fatalf("put: %v", err)
			}
			acks := waitAcks(t, f.store, map[tiers.BatchID]int{id: len(pages)}, h.AckTimeout)
			failed := make([]bool, len(pages))
			for _, a := range acks[id] {
				if a.Stage == tiers.AckFailed {
					if !c.changed {
						t.Fatalf("put item %d (%s): %v", a.Index, pages[a.Index].key, a.Err)
					}
					failed[a.Index] = true // refusing it is as good as a miss
				}
			}
			// f.get fails the test on a hit whose bytes are not the
			// original page's (the flipped ones included).
			res := f.get(t, SlabPages, pages)
			for i, err := range res {
				switch {
				case c.wantHit && err != nil:
					t.Fatalf("get item %d (%s): %v, want a hit", i, pages[i].key, err)
				case !c.wantHit && err == nil:
					t.Fatalf("get item %d (%s): a hit, want a miss (failed put %t)", i, pages[i].key, failed[i])
				}
			}
		})
	}
}

func testKindsDistinct(t *testing.T, h StoreHarness) {
	if len(h.Payload.Kinds) < 2 {
		t.Skip("harness has one payload kind; kind separation needs two")
	}
	f := newFixture(t, h)
	kv := f.makePages(21, 4, 0)
	f.putOK(t, 0, kv)
	// Same hashes, kind 1: not stored, so all misses.
	other := make([]page, len(kv))
	size, _ := h.Payload.PageBytes(1)
	for i, p := range kv {
		k := tiers.Key{Hash: p.key.Hash, Kind: 1}
		other[i] = page{key: k, data: content(k, size)}
	}
	allMiss(t, "other kind before put", f.get(t, SlabPages, other))
	f.putOK(t, 8, other)
	allHit(t, "kind 0 after kind 1 put", f.get(t, SlabPages, kv))
	allHit(t, "kind 1", f.get(t, SlabPages+8, other))
}

func testIdempotentPut(t *testing.T, h StoreHarness) {
	f := newFixture(t, h)
	pages := f.makePages(31, 6, 0)
	f.putOK(t, 0, pages)
	f.putOK(t, 8, pages)
	allHit(t, "get after second put", f.get(t, SlabPages, pages))
}

func testLongestPrefix(t *testing.T, h StoreHarness) {
	f := newFixture(t, h)
	pages := f.makePages(41, 10, 0)
	// Store pages 0-3 and 5-9: the prefix stops at the hole.
	f.putOK(t, 0, pages[:4])
	f.putOK(t, 4, pages[5:])
	chain := make([]pagehash.Hash, len(pages))
	for i, p := range pages {
		chain[i] = p.key.Hash
	}
	ctx := context.Background()
	for _, tc := range []struct {
		chain []pagehash.Hash
		want  int
	}{
		{chain, 4},
		{chain[:2], 2},
		{chain[5:], 5},
		{chain[4:], 0},
		{nil, 0},
	} {
		n, err := f.store.LongestPrefix(ctx, 0, tc.chain)
		if err != nil || n != tc.want {
			t.Fatalf("longest prefix of %d hashes = %d, %v; want %d", len(tc.chain), n, err, tc.want)
		}
	}
	if len(h.Payload.Kinds) > 1 {
		if n, err := f.store.LongestPrefix(ctx, 1, chain); err != nil || n != 0 {
			t.Fatalf("longest prefix for unstored kind = %d, %v; want 0", n, err)
		}
	}
}

func testDeleteTouch(t *testing.T, h StoreHarness) {
	f := newFixture(t, h)
	pages := f.makePages(51, 8, 0)
	f.putOK(t, 0, pages)
	ctx := context.Background()
	keys := make([]tiers.Key, len(pages))
	for i, p := range pages {
		keys[i] = p.key
	}
	absent := f.makePages(52, 2, 0)
	if err := f.store.Touch(ctx, append(keys[:4:4], absent[0].key)); err != nil {
		t.Fatalf("touch (one key absent): %v", err)
	}
	if err := f.store.Delete(ctx, append(keys[:3:3], absent[1].key)); err != nil {
		t.Fatalf("delete (one key absent): %v", err)
	}
	res := f.get(t, SlabPages, pages)
	allMiss(t, "deleted pages", res[:3])
	allHit(t, "kept pages", res[3:])
	if err := f.store.Delete(ctx, keys[:3]); err != nil {
		t.Fatalf("delete twice: %v", err)
	}
}

func testEmptyBatches(t *testing.T, h StoreHarness) {
	f := newFixture(t, h)
	ctx := context.Background()
	if _, err := f.store.Put(ctx, nil); err != nil {
		t.Fatalf("empty put: %v", err)
	}
	if err := f.store.Get(ctx, nil, nil); err != nil {
		t.Fatalf("empty get: %v", err)
	}
	if err := f.store.Delete(ctx, nil); err != nil {
		t.Fatalf("empty delete: %v", err)
	}
	if err := f.store.Touch(ctx, nil); err != nil {
		t.Fatalf("empty touch: %v", err)
	}
	time.Sleep(10 * time.Millisecond)
	if acks := f.store.DrainAcks(nil); len(acks) != 0 {
		t.Fatalf("acks for an empty put: %+v", acks)
	}
}

func testMalformed(t *testing.T, h StoreHarness) {
	f := newFixture(t, h)
	ctx := context.Background()
	good := f.makePages(61, 2, 0)
	size, _ := h.Payload.PageBytes(0)
	slabSize := f.slab.Geometry().Slabs[0].Size
	bad := []struct {
		name string
		span tiers.Span
		kind tiers.PayloadKind
	}{
		{"span past the slab end", tiers.Span{Offset: slabSize - size/2, Length: size}, 0},
		{"negative offset", tiers.Span{Offset: -4096, Length: size}, 0},
		{"length not page_bytes", tiers.Span{Offset: 0, Length: size - 1}, 0},
		{"unknown slab", tiers.Span{Slab: 999, Offset: 0, Length: size}, 0},
		{"unknown payload kind", tiers.Span{Offset: 0, Length: size}, tiers.PayloadKind(len(h.Payload.Kinds))},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			key := tiers.Key{Hash: good[1].key.Hash, Kind: tc.kind}
			reqs := []tiers.PutRequest{{Key: good[0].key, Src: f.span(0, 0)}, {Key: key, Src: tc.span}}
			copy(f.bytes(t, f.span(0, 0)), good[0].data)
			if _, err := f.store.Put(ctx, reqs); !errors.Is(err, tiers.ErrInvalid) {
				t.Fatalf("put with %s: err = %v, want tiers.ErrInvalid", tc.name, err)
			}
			gets := []tiers.GetRequest{{Key: good[0].key, Dst: f.span(1, 0)}, {Key: key, Dst: tc.span}}
			if err := f.store.Get(ctx, gets, make([]error, 2)); !errors.Is(err, tiers.ErrInvalid) {
				t.Fatalf("get with %s: err = %v, want tiers.ErrInvalid", tc.name, err)
			}
		})
	}
	// The refused put stored nothing, not even its good item.
	allMiss(t, "good item of a refused batch", f.get(t, SlabPages, good[:1]))
	if err := f.store.Get(ctx, []tiers.GetRequest{{Key: good[0].key, Dst: f.span(0, 0)}}, nil); !errors.Is(err, tiers.ErrInvalid) {
		t.Fatalf("get with a short results slice: err = %v, want tiers.ErrInvalid", err)
	}
}

func testConcurrent(t *testing.T, h StoreHarness) {
	f := newFixture(t, h)
	const workers = 4
	const per = SlabPages * 2 / workers // slots per worker
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	// One goroutine drains acks for everyone, as a host's tick would.
	var mu sync.Mutex
	terminal := make(map[tiers.BatchID]int)
	stop := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		var buf []tiers.Ack
		for {
			buf = f.store.DrainAcks(buf[:0])
			mu.Lock()
			for _, a := range buf {
				if a.Stage != tiers.AckGathered {
					terminal[a.Batch]++
				}
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-f.store.AckReady():
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	waitTerminal := func(id tiers.BatchID, n int) error {
		deadline := time.Now().Add(h.AckTimeout)
		for time.Now().Before(deadline) {
			mu.Lock()
			got := terminal[id]
			mu.Unlock()
			if got == n {
				return nil
			}
			time.Sleep(time.Millisecond)
		}
		return fmt.Errorf("batch %d: timed out waiting for %d terminal acks", id, n)
	}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			base := w * per
			for round := range 4 {
				pages := f.makePages(uint64(1000+w*10+round), per/2, 0)
				reqs := make([]tiers.PutRequest, len(pages))
				for i, p := range pages {
					sp := f.span(base+i, 0)
					b, err := f.slab.Bytes(sp)
					if err != nil {
						errs <- err
						return
					}
					copy(b, p.data)
					reqs[i] = tiers.PutRequest{Key: p.key, Src: sp}
				}
				id, err := f.store.Put(ctx, reqs)
				if err != nil {
					errs <- fmt.Errorf("worker %d put: %w", w, err)
					return
				}
				if err := waitTerminal(id, len(reqs)); err != nil {
					errs <- err
					return
				}
				gets := make([]tiers.GetRequest, len(pages))
				for i, p := range pages {
					gets[i] = tiers.GetRequest{Key: p.key, Dst: f.span(base+per/2+i, 0)}
				}
				res := make([]error, len(gets))
				if err := f.store.Get(ctx, gets, res); err != nil {
					errs <- fmt.Errorf("worker %d get: %w", w, err)
					return
				}
				for i, p := range pages {
					if res[i] != nil {
						continue // capacity may evict; a miss is allowed, wrong bytes are not
					}
					b, _ := f.slab.Bytes(gets[i].Dst)
					if !bytes.Equal(b, p.data) {
						errs <- fmt.Errorf("worker %d: page %s hit with wrong bytes", w, p.key)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-drained
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func testCapacity(t *testing.T, h StoreHarness) {
	if h.CapacityPages <= 0 {
		t.Skip("harness declares no capacity")
	}
	f := newFixture(t, h)
	total := 3 * h.CapacityPages
	var all []page
	for b := 0; len(all) < total; b++ {
		pages := f.makePages(uint64(5000+b), min(SlabPages, total-len(all)), 0)
		for i, err := range f.put(t, 0, pages) {
			if err != nil && !errors.Is(err, tiers.ErrFull) {
				t.Fatalf("put beyond capacity, item %d: %v (want success or tiers.ErrFull)", i, err)
			}
		}
		all = append(all, pages...)
	}
	hits := 0
	for i := 0; i < len(all); i += SlabPages {
		res := f.get(t, SlabPages, all[i:min(len(all), i+SlabPages)])
		for _, err := range res {
			if err == nil {
				hits++
			}
		}
	}
	if hits > h.CapacityPages+h.CapacityPages/4 {
		t.Fatalf("%d pages hit after writing %d into a store of about %d pages", hits, total, h.CapacityPages)
	}
	if hits == 0 {
		t.Fatalf("no page of %d survived in a store of about %d pages", total, h.CapacityPages)
	}
}

func testClosed(t *testing.T, h StoreHarness) {
	f := newFixture(t, h)
	pages := f.makePages(71, 2, 0)
	f.putOK(t, 0, pages)
	if err := f.store.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	ctx := context.Background()
	if _, err := f.store.Put(ctx, []tiers.PutRequest{{Key: pages[0].key, Src: f.span(0, 0)}}); !errors.Is(err, tiers.ErrClosed) {
		t.Fatalf("put after close: %v, want tiers.ErrClosed", err)
	}
	if err := f.store.Get(ctx, []tiers.GetRequest{{Key: pages[0].key, Dst: f.span(0, 0)}}, make([]error, 1)); !errors.Is(err, tiers.ErrClosed) {
		t.Fatalf("get after close: %v, want tiers.ErrClosed", err)
	}
	if _, err := f.store.LongestPrefix(ctx, 0, []pagehash.Hash{pages[0].key.Hash}); !errors.Is(err, tiers.ErrClosed) {
		t.Fatalf("longest prefix after close: %v, want tiers.ErrClosed", err)
	}
	if err := f.store.Delete(ctx, []tiers.Key{pages[0].key}); !errors.Is(err, tiers.ErrClosed) {
		t.Fatalf("delete after close: %v, want tiers.ErrClosed", err)
	}
	if err := f.store.Touch(ctx, []tiers.Key{pages[0].key}); !errors.Is(err, tiers.ErrClosed) {
		t.Fatalf("touch after close: %v, want tiers.ErrClosed", err)
	}
	if err := f.store.Close(); err != nil && !errors.Is(err, tiers.ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
}

func testDurable(t *testing.T, h StoreHarness) {
	if h.Reopen == nil {
		t.Skip("harness declares the store not persistent (no Reopen)")
	}
	f := newFixture(t, h)
	pages := f.makePages(81, 12, 0)
	f.putOK(t, 0, pages)
	if err := f.store.Close(); err != nil {
		t.Fatalf("close before reopen: %v", err)
	}
	st, sl := h.Reopen(t)
	g := attach(t, h, st, sl)
	allHit(t, "get after reopen", g.get(t, SlabPages, pages))
}

package tiertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/tiers"
)

// PoolHarness tells the suite how to open the pool under test.
type PoolHarness struct {
	// Payload is the payload geometry the pool is opened with. Use at least
	// two kinds and page sizes that are not powers of two.
	Payload tiers.PayloadGeometry
	// Open returns a fresh pool of at least PoolPages pages and the slab it
	// copies to and from. Slab 0 must hold 2*PoolPages slots of the largest
	// payload. The suite closes the pool itself in some subtests, so Close
	// must be safe to call twice; other cleanup is the harness's.
	Open func(t *testing.T) (tiers.Pool, tiers.Slab)
	// AckTimeout bounds waiting for acks (default 20s).
	AckTimeout time.Duration
}

// PoolPages is the number of pool pages the suite uses.
const PoolPages = 32

// RunPool runs the Pool v1 conformance suite: byte-exact round trips
// through every kind, the ack protocol (exactly one AckCopied or AckFailed
// per item, ids increasing from 1), malformed batches refused whole with
// tiers.ErrInvalid and without acks, empty batches, concurrent copies,
// stats, and a closed pool answering tiers.ErrClosed.
func RunPool(t *testing.T, h PoolHarness) {
	t.Helper()
	if h.Open == nil || len(h.Payload.Kinds) == 0 {
		t.Fatal("tiertest: pool harness needs Open and a payload geometry")
	}
	if h.AckTimeout == 0 {
		h.AckTimeout = 20 * time.Second
	}
	tests := []struct {
		name string
		run  func(t *testing.T, f *poolFixture)
	}{
		{"Geometry", testPoolGeometry},
		{"RoundTripExact", testPoolRoundTrip},
		{"KindsAreDistinct", testPoolKindsDistinct},
		{"AckProtocol", testPoolAckProtocol},
		{"EmptyBatches", testPoolEmpty},
		{"MalformedBatches", testPoolMalformed},
		{"Concurrent", testPoolConcurrent},
		{"Stats", testPoolStats},
		{"Closed", testPoolClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newPoolFixture(t, h)) })
	}
}

// poolFixture lays slab slots out like the Store suite: slot i at
// i*largest-payload bytes of slab 0.
type poolFixture struct {
	h    PoolHarness
	pool tiers.Pool
	slab tiers.Slab
	slot int64
	acks *collector // shared by the goroutines of the concurrent test
}

func newPoolFixture(t *testing.T, h PoolHarness) *poolFixture {
	t.Helper()
	p, sl := h.Open(t)
	f := &poolFixture{h: h, pool: p, slab: sl, acks: &collector{p: p, seen: map[tiers.BatchID][]tiers.Ack{}}}
	for k := range h.Payload.Kinds {
		n, _ := h.Payload.PageBytes(tiers.PayloadKind(k))
		f.slot = max(f.slot, n)
	}
	g := sl.Geometry()
	if len(g.Slabs) == 0 || g.Slabs[0].Size < 2*PoolPages*f.slot {
		t.Fatalf("tiertest: slab 0 must hold %d bytes (2 x %d slots of %d), geometry %+v", 2*PoolPages*f.slot, PoolPages, f.slot, g)
	}
	if pg := p.Geometry().Pages; pg < PoolPages {
		t.Fatalf("tiertest: pool has %d pages, the suite needs %d", pg, PoolPages)
	}
	return f
}

func (f *poolFixture) span(i int, k tiers.PayloadKind) tiers.Span {
	n, _ := f.h.Payload.PageBytes(k)
	return tiers.Span{Slab: 0, Offset: int64(i) * f.slot, Length: n}
}

func (f *poolFixture) bytes(t *testing.T, sp tiers.Span) []byte {
	t.Helper()
	b, err := f.slab.Bytes(sp)
	if err != nil {
		t.Fatalf("slab bytes %+v: %v", sp, err)
	}
	return b
}

// fill writes a pattern derived from (seed, page, kind) into slot i.
func (f *poolFixture) fill(t *testing.T, i int, k tiers.PayloadKind, seed uint64) []byte {
	t.Helper()
	b := f.bytes(t, f.span(i, k))
	rng := rand.New(rand.NewPCG(seed, uint64(i)<<8|uint64(k)))
	for j := range b {
		b[j] = byte(rng.Uint32())
	}
	return bytes.Clone(b)
}

// copyWait runs one copy batch and waits until every item is acked
// copied; a failed item fails the test.
func (f *poolFixture) copyWait(t *testing.T, toSlab bool, batch []tiers.PoolCopy) {
	t.Helper()
	if err := copyAndWait(context.Background(), f, toSlab, batch); err != nil {
		t.Fatalf("copy (to slab %v) of %d items: %v", toSlab, len(batch), err)
	}
}

// waitPoolAcks drains acks until every batch in want has want[id] acks,
// checking the pool ack protocol as it goes: known batches, indexes in
// range, one terminal ack per item, AckCopied without an error and
// AckFailed with one, no other stage.
func waitPoolAcks(t *testing.T, p tiers.Pool, want map[tiers.BatchID]int, timeout time.Duration) map[tiers.BatchID][]tiers.Ack {
	t.Helper()
	got := make(map[tiers.BatchID][]tiers.Ack)
	left := 0
	for _, n := range want {
		left += n
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var buf []tiers.Ack
	for left > 0 {
		buf = p.DrainAcks(buf[:0])
		for _, a := range buf {
			if err := checkPoolAck(a, want, got); err != nil {
				t.Fatal(err)
			}
			got[a.Batch] = append(got[a.Batch], a)
			left--
		}
		if left == 0 {
			break
		}
		select {
		case <-p.AckReady():
		case <-time.After(5 * time.Millisecond):
		case <-deadline.C:
			t.Fatalf("timed out after %v with %d pool acks missing (have %v)", timeout, left, got)
		}
	}
	return got
}

// checkPoolAck returns an error if a breaks the pool ack protocol given
// the acks already seen.
func checkPoolAck(a tiers.Ack, want map[tiers.BatchID]int, seen map[tiers.BatchID][]tiers.Ack) error {
	n, ok := want[a.Batch]
	if !ok {
		return fmt.Errorf("pool ack for unknown batch %d: %+v", a.Batch, a)
	}
	if a.Index < 0 || a.Index >= n {
		return fmt.Errorf("pool ack index %d out of range for batch %d of %d items", a.Index, a.Batch, n)
	}
	for _, prev := range seen[a.Batch] {
		if prev.Index == a.Index {
			return fmt.Errorf("second pool ack %+v for batch %d item %d (first %+v)", a, a.Batch, a.Index, prev)
		}
	}
	switch a.Stage {
	case tiers.AckCopied:
		if a.Err != nil {
			return fmt.Errorf("copied ack with an error: %+v", a)
		}
	case tiers.AckFailed:
		if a.Err == nil {
			return fmt.Errorf("failed ack without an error: %+v", a)
		}
	default:
		return fmt.Errorf("pool ack with stage %v, want copied or failed: %+v", a.Stage, a)
	}
	return nil
}

func testPoolGeometry(t *testing.T, f *poolFixture) {
	g := f.pool.Geometry()
	if g.Device == "" {
		t.Error("geometry names no device")
	}
	if len(g.Payload.Kinds) != len(f.h.Payload.Kinds) {
		t.Fatalf("geometry has %d payload kinds, opened with %d", len(g.Payload.Kinds), len(f.h.Payload.Kinds))
	}
	for k, spec := range f.h.Payload.Kinds {
		if g.Payload.Kinds[k].PageBytes != spec.PageBytes {
			t.Errorf("kind %d: geometry page_bytes %d, opened with %d", k, g.Payload.Kinds[k].PageBytes, spec.PageBytes)
		}
	}
}

// roundTrip copies slots [0,n) into the pool pages perm[i] and back into
// slots [PoolPages, PoolPages+n), and compares every byte.
func roundTrip(t *testing.T, f *poolFixture, k tiers.PayloadKind, seed uint64, perm []int) {
	t.Helper()
	want := make([][]byte, len(perm))
	in := make([]tiers.PoolCopy, len(perm))
	out := make([]tiers.PoolCopy, len(perm))
	for i, pg := range perm {
		want[i] = f.fill(t, i, k, seed)
		in[i] = tiers.PoolCopy{Page: pg, Kind: k, Span: f.span(i, k)}
		out[i] = tiers.PoolCopy{Page: pg, Kind: k, Span: f.span(PoolPages+i, k)}
		clear(f.bytes(t, out[i].Span))
	}
	f.copyWait(t, false, in)
	f.copyWait(t, true, out)
	for i := range perm {
		if got := f.bytes(t, out[i].Span); !bytes.Equal(got, want[i]) {
			t.Fatalf("seed %d: kind %d page %d came back with different bytes (first difference at %d)", seed, k, perm[i], firstDiff(got, want[i]))
		}
	}
}

func testPoolRoundTrip(t *testing.T, f *poolFixture) {
	const seed = 7
	rng := rand.New(rand.NewPCG(seed, 1))
	for k := range f.h.Payload.Kinds {
		perm := rng.Perm(PoolPages)
		roundTrip(t, f, tiers.PayloadKind(k), seed+uint64(k), perm)
	}
}

func testPoolKindsDistinct(t *testing.T, f *poolFixture) {
	if len(f.h.Payload.Kinds) < 2 {
		t.Skip("one payload kind")
	}
	// Write kind 0 then kind 1 of the same pages; kind 0 must still read
	// back as written.
	pages := []int{3, 4, 5}
	want := make([][]byte, len(pages))
	var in0, in1, out0 []tiers.PoolCopy
	for i, pg := range pages {
		want[i] = f.fill(t, i, 0, 11)
		f.fill(t, 8+i, 1, 12)
		in0 = append(in0, tiers.PoolCopy{Page: pg, Kind: 0, Span: f.span(i, 0)})
		in1 = append(in1, tiers.PoolCopy{Page: pg, Kind: 1, Span: f.span(8+i, 1)})
		out0 = append(out0, tiers.PoolCopy{Page: pg, Kind: 0, Span: f.span(PoolPages+i, 0)})
	}
	f.copyWait(t, false, in0)
	f.copyWait(t, false, in1)
	f.copyWait(t, true, out0)
	for i := range pages {
		if got := f.bytes(t, out0[i].Span); !bytes.Equal(got, want[i]) {
			t.Fatalf("kind 0 of page %d changed when kind 1 was written", pages[i])
		}
	}
}

func testPoolAckProtocol(t *testing.T, f *poolFixture) {
	ctx := context.Background()
	want := map[tiers.BatchID]int{}
	var last tiers.BatchID
	for b := range 4 {
		batch := make([]tiers.PoolCopy, b+1)
		for i := range batch {
			batch[i] = tiers.PoolCopy{Page: b*4 + i, Kind: 0, Span: f.span(b*4+i, 0)}
		}
		var id tiers.BatchID
		var err error
		if b%2 == 0 {
			id, err = f.pool.CopyFromSlab(ctx, batch)
		} else {
			id, err = f.pool.CopyToSlab(ctx, batch)
		}
		if err != nil {
			t.Fatalf("batch %d: %v", b, err)
		}
		if id <= last {
			t.Fatalf("batch id %d after %d: ids must increase", id, last)
		}
		last = id
		want[id] = len(batch)
	}
	got := waitPoolAcks(t, f.pool, want, f.h.AckTimeout)
	for id, n := range want {
		if len(got[id]) != n {
			t.Fatalf("batch %d: %d acks for %d items", id, len(got[id]), n)
		}
	}
	time.Sleep(10 * time.Millisecond)
	if extra := f.pool.DrainAcks(nil); len(extra) != 0 {
		t.Fatalf("acks after every item was acked: %+v", extra)
	}
}

func testPoolEmpty(t *testing.T, f *poolFixture) {
	ctx := context.Background()
	for _, toSlab := range []bool{false, true} {
		var id tiers.BatchID
		var err error
		if toSlab {
			id, err = f.pool.CopyToSlab(ctx, nil)
		} else {
			id, err = f.pool.CopyFromSlab(ctx, nil)
		}
		if err != nil || id != 0 {
			t.Fatalf("empty batch (to slab %v): id %d, %v; want 0, nil", toSlab, id, err)
		}
	}
	time.Sleep(10 * time.Millisecond)
	if acks := f.pool.DrainAcks(nil); len(acks) != 0 {
		t.Fatalf("acks for empty batches: %+v", acks)
	}
}

func testPoolMalformed(t *testing.T, f *poolFixture) {
	ctx := context.Background()
	// Page 0 of kind 0 holds known bytes; no malformed batch may touch it.
	roundTrip(t, f, 0, 21, []int{0})
	want := bytes.Clone(f.bytes(t, f.span(PoolPages, 0)))
	size0, _ := f.h.Payload.PageBytes(0)
	slabSize := f.slab.Geometry().Slabs[0].Size
	good := tiers.PoolCopy{Page: 0, Kind: 0, Span: f.span(1, 0)}
	cases := []struct {
		name string
		bad  tiers.PoolCopy
	}{
		{"negative page", tiers.PoolCopy{Page: -1, Kind: 0, Span: f.span(1, 0)}},
		{"page past the end", tiers.PoolCopy{Page: f.pool.Geometry().Pages, Kind: 0, Span: f.span(1, 0)}},
		{"unknown kind", tiers.PoolCopy{Page: 1, Kind: tiers.PayloadKind(len(f.h.Payload.Kinds)), Span: f.span(1, 0)}},
		{"short span", tiers.PoolCopy{Page: 1, Kind: 0, Span: tiers.Span{Slab: 0, Offset: 0, Length: size0 - 1}}},
		{"span past the slab", tiers.PoolCopy{Page: 1, Kind: 0, Span: tiers.Span{Slab: 0, Offset: slabSize - size0 + 1, Length: size0}}},
		{"unknown slab", tiers.PoolCopy{Page: 1, Kind: 0, Span: tiers.Span{Slab: 99, Offset: 0, Length: size0}}},
	}
	f.fill(t, 1, 0, 22) // what a wrongly accepted CopyFromSlab would write
	for _, c := range cases {
		for _, toSlab := range []bool{false, true} {
			batch := []tiers.PoolCopy{good, c.bad}
			var err error
			if toSlab {
				batch[0].Span = f.span(2, 0)
				_, err = f.pool.CopyToSlab(ctx, batch)
			} else {
				_, err = f.pool.CopyFromSlab(ctx, batch)
			}
			if !errors.Is(err, tiers.ErrInvalid) {
				t.Errorf("%s (to slab %v): %v, want ErrInvalid", c.name, toSlab, err)
			}
		}
	}
	dup := []tiers.PoolCopy{{Page: 0, Kind: 0, Span: f.span(1, 0)}, {Page: 0, Kind: 0, Span: f.span(2, 0)}}
	if _, err := f.pool.CopyFromSlab(ctx, dup); !errors.Is(err, tiers.ErrInvalid) {
		t.Errorf("copy from slab writing one page twice: %v, want ErrInvalid", err)
	}
	time.Sleep(10 * time.Millisecond)
	if acks := f.pool.DrainAcks(nil); len(acks) != 0 {
		t.Fatalf("acks for refused batches: %+v", acks)
	}
	// Nothing of a refused batch was copied: page 0 still holds its bytes.
	clear(f.bytes(t, f.span(PoolPages, 0)))
	f.copyWait(t, true, []tiers.PoolCopy{{Page: 0, Kind: 0, Span: f.span(PoolPages, 0)}})
	if !bytes.Equal(f.bytes(t, f.span(PoolPages, 0)), want) {
		t.Fatal("a refused batch changed pool page 0")
	}
}

func testPoolConcurrent(t *testing.T, f *poolFixture) {
	// Four goroutines each own PoolPages/4 pages and slots and run round
	// trips at once; every byte must come back.
	const workers = 4
	per := PoolPages / workers
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := range 5 {
				var in, out []tiers.PoolCopy
				var want [][]byte
				for j := range per {
					i := w*per + j
					b, err := f.slab.Bytes(f.span(i, 0))
					if err != nil {
						errs <- err
						return
					}
					for x := range b {
						b[x] = byte(w*31 + round*7 + j + x)
					}
					want = append(want, bytes.Clone(b))
					in = append(in, tiers.PoolCopy{Page: i, Kind: 0, Span: f.span(i, 0)})
					out = append(out, tiers.PoolCopy{Page: i, Kind: 0, Span: f.span(PoolPages+i, 0)})
				}
				if err := copyAndWait(ctx, f, false, in); err != nil {
					errs <- fmt.Errorf("worker %d round %d in: %w", w, round, err)
					return
				}
				if err := copyAndWait(ctx, f, true, out); err != nil {
					errs <- fmt.Errorf("worker %d round %d out: %w", w, round, err)
					return
				}
				for j := range out {
					got, _ := f.slab.Bytes(out[j].Span)
					if !bytes.Equal(got, want[j]) {
						errs <- fmt.Errorf("worker %d round %d: page %d came back wrong", w, round, out[j].Page)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// copyAndWait is copyWait for goroutines: several may drain the same
// pool, so each waits for its own batch through a shared collector.
func copyAndWait(ctx context.Context, f *poolFixture, toSlab bool, batch []tiers.PoolCopy) error {
	var id tiers.BatchID
	var err error
	if toSlab {
		id, err = f.pool.CopyToSlab(ctx, batch)
	} else {
		id, err = f.pool.CopyFromSlab(ctx, batch)
	}
	if err != nil {
		return err
	}
	return f.acks.wait(id, len(batch), f.h.AckTimeout)
}

// collector shares one pool's ack stream among concurrent waiters.
type collector struct {
	p    tiers.Pool
	mu   sync.Mutex
	seen map[tiers.BatchID][]tiers.Ack
}

func (c *collector) wait(id tiers.BatchID, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c.mu.Lock()
		for _, a := range c.p.DrainAcks(nil) {
			c.seen[a.Batch] = append(c.seen[a.Batch], a)
		}
		acks := c.seen[id]
		c.mu.Unlock()
		if len(acks) > n {
			return fmt.Errorf("batch %d: %d acks for %d items", id, len(acks), n)
		}
		if len(acks) == n {
			for _, a := range acks {
				if err := checkPoolAck(a, map[tiers.BatchID]int{id: n}, nil); err != nil {
					return err
				}
				if a.Stage != tiers.AckCopied {
					return fmt.Errorf("batch %d item %d failed: %w", id, a.Index, a.Err)
				}
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("batch %d: %d of %d acks after %v", id, len(acks), n, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

func testPoolStats(t *testing.T, f *poolFixture) {
	before := f.pool.Stats()
	roundTrip(t, f, 0, 31, []int{1, 2, 3})
	after := f.pool.Stats()
	size, _ := f.h.Payload.PageBytes(0)
	if d := after.PagesFromSlab - before.PagesFromSlab; d != 3 {
		t.Errorf("PagesFromSlab grew by %d, want 3", d)
	}
	if d := after.PagesToSlab - before.PagesToSlab; d != 3 {
		t.Errorf("PagesToSlab grew by %d, want 3", d)
	}
	if d := after.BytesFromSlab - before.BytesFromSlab; d != 3*size {
		t.Errorf("BytesFromSlab grew by %d, want %d", d, 3*size)
	}
	if d := after.BytesToSlab - before.BytesToSlab; d != 3*size {
		t.Errorf("BytesToSlab grew by %d, want %d", d, 3*size)
	}
}

func testPoolClosed(t *testing.T, f *poolFixture) {
	ctx := context.Background()
	batch := []tiers.PoolCopy{{Page: 0, Kind: 0, Span: f.span(0, 0)}}
	id, err := f.pool.CopyFromSlab(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.pool.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	// The copy started before Close finished and its ack is drainable.
	waitPoolAcks(t, f.pool, map[tiers.BatchID]int{id: 1}, f.h.AckTimeout)
	if _, err := f.pool.CopyFromSlab(ctx, batch); !errors.Is(err, tiers.ErrClosed) {
		t.Errorf("copy from slab after close: %v, want ErrClosed", err)
	}
	if _, err := f.pool.CopyToSlab(ctx, batch); !errors.Is(err, tiers.ErrClosed) {
		t.Errorf("copy to slab after close: %v, want ErrClosed", err)
	}
	if err := f.pool.Close(); err != nil && !errors.Is(err, tiers.ErrClosed) {
		t.Errorf("second close: %v, want nil or ErrClosed", err)
	}
}

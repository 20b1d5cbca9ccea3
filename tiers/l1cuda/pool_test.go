package l1cuda

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// testPayload has two kinds whose sizes are not powers of two and split
// into 4 layers.
var testPayload = tiers.PayloadGeometry{PageTokens: 16, Kinds: []tiers.PayloadSpec{
	{Name: "kv", PageBytes: 12_288 + 4*25},
	{Name: "idx", PageBytes: 4 * 250},
}}

func testEnv(slab tiers.Slab) tiers.Env {
	return tiers.Env{Logger: slog.New(slog.DiscardHandler), Payload: testPayload, WorldSize: 1, Slab: slab}
}

func testSlab() *tiertest.HeapSlab {
	return tiertest.NewHeapSlab(2 * tiertest.PoolPages * testPayload.Kinds[0].PageBytes)
}

func TestHostPoolConformance(t *testing.T) {
	for _, layers := range []int{1, 4} {
		t.Run(map[int]string{1: "1layer", 4: "4layers"}[layers], func(t *testing.T) {
			tiertest.RunPool(t, tiertest.PoolHarness{
				Payload: testPayload,
				Open: func(t *testing.T) (tiers.Pool, tiers.Slab) {
					slab := testSlab()
					p, err := OpenHost(testEnv(slab), HostConfig{Pages: tiertest.PoolPages, Layers: layers, Workers: 2})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { p.Close() })
					return p, slab
				},
			})
		})
	}
}

// TestHostPoolLayerFirst pins the memory layout: the slice of layer l of
// page p of a kind lies at (l*pages + p) * slice in that kind's memory.
func TestHostPoolLayerFirst(t *testing.T) {
	slab := testSlab()
	const pages, layers = 8, 4
	p, err := OpenHost(testEnv(slab), HostConfig{Pages: pages, Layers: layers, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	size := testPayload.Kinds[0].PageBytes
	slice := size / layers
	span := tiers.Span{Slab: 0, Offset: 0, Length: size}
	b, _ := slab.Bytes(span)
	for l := range layers {
		for i := range slice {
			b[int64(l)*slice+i] = byte(l + 1)
		}
	}
	const page = 5
	id, err := p.CopyFromSlab(context.Background(), []tiers.PoolCopy{{Page: page, Kind: 0, Span: span}})
	if err != nil {
		t.Fatal(err)
	}
	waitIDs(t, p, id)
	for l := range layers {
		off := (int64(l)*pages + page) * slice
		got := p.mem[0][off : off+slice]
		for i, v := range got {
			if v != byte(l+1) {
				t.Fatalf("layer %d byte %d of page %d at offset %d = %d, want %d", l, i, page, off, v, l+1)
			}
		}
	}
}

// waitIDs drains acks of p until every item of the batches ids is acked
// copied.
func waitIDs(t *testing.T, p tiers.Pool, ids ...tiers.BatchID) {
	t.Helper()
	left := map[tiers.BatchID]bool{}
	for _, id := range ids {
		left[id] = true
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(left) > 0 {
		for _, a := range p.DrainAcks(nil) {
			if a.Stage != tiers.AckCopied {
				t.Fatalf("ack %+v", a)
			}
			delete(left, a.Batch)
		}
		if time.Now().After(deadline) {
			t.Fatalf("batches %v not acked", left)
		}
		time.Sleep(time.Millisecond)
	}
}

// fakeEngine stands for an engine's copy kernels in tests: it owns pool
// memory in the layer-first layout and runs the copies the engine pool
// plans. It is a test double of the engine, not of the pool.
type fakeEngine struct {
	pool *EnginePool
	slab tiers.Slab
	mem  [][]byte
	fail func(PlannedCopy) error // optional fault injection
	stop chan struct{}
	wg   sync.WaitGroup
}

func startFakeEngine(t *testing.T, pool *EnginePool, slab tiers.Slab) *fakeEngine {
	e := &fakeEngine{pool: pool, slab: slab, stop: make(chan struct{})}
	for k := range pool.lay.kinds {
		e.mem = append(e.mem, make([]byte, pool.lay.kindBytes(tiers.PayloadKind(k))))
	}
	e.wg.Add(1)
	go e.loop(t)
	return e
}

func (e *fakeEngine) loop(t *testing.T) {
	defer e.wg.Done()
	var plans []PlannedCopy
	for {
		select {
		case <-e.stop:
			return
		case <-time.After(200 * time.Microsecond):
		}
		plans = e.pool.TakePlans(plans[:0])
		for _, pc := range plans {
			var err error
			if e.fail != nil {
				err = e.fail(pc)
			}
			if err == nil {
				span, _ := e.slab.Bytes(pc.Copy.Span)
				lay := e.pool.lay
				slice := lay.slice(pc.Copy.Kind)
				for l := range int64(lay.layers) {
					off := (l*int64(lay.pages) + int64(pc.Copy.Page)) * slice
					dev := e.mem[pc.Copy.Kind][off : off+slice]
					host := span[l*slice : (l+1)*slice]
					if pc.ToSlab {
						copy(host, dev)
					} else {
						copy(dev, host)
					}
				}
			}
			if cerr := e.pool.Complete(pc.Batch, pc.Index, err); cerr != nil {
				t.Errorf("complete %+v: %v", pc, cerr)
			}
		}
	}
}

func (e *fakeEngine) halt() { close(e.stop); e.wg.Wait() }

func TestEnginePoolConformance(t *testing.T) {
	tiertest.RunPool(t, tiertest.PoolHarness{
		Payload: testPayload,
		Open: func(t *testing.T) (tiers.Pool, tiers.Slab) {
			slab := testSlab()
			p, err := OpenEngine(testEnv(slab), EngineConfig{Pages: tiertest.PoolPages, Layers: 4, MaxPending: 1024})
			if err != nil {
				t.Fatal(err)
			}
			e := startFakeEngine(t, p, slab)
			t.Cleanup(func() { e.halt(); p.Close() })
			return p, slab
		},
	})
}

func TestEnginePoolCompletions(t *testing.T) {
	ctx := context.Background()
	slab := testSlab()
	p, err := OpenEngine(testEnv(slab), EngineConfig{Pages: 8, Layers: 1, MaxPending: 3})
	if err != nil {
		t.Fatal(err)
	}
	size := testPayload.Kinds[0].PageBytes
	item := func(page int) tiers.PoolCopy {
		return tiers.PoolCopy{Page: page, Kind: 0, Span: tiers.Span{Offset: int64(page) * size, Length: size}}
	}
	id, err := p.CopyToSlab(ctx, []tiers.PoolCopy{item(0), item(1)})
	if err != nil || id != 1 {
		t.Fatalf("first batch: id %d, %v", id, err)
	}
	if _, err := p.CopyToSlab(ctx, []tiers.PoolCopy{item(2), item(3)}); !errors.Is(err, ErrBusy) {
		t.Fatalf("batch over max_pending: %v, want ErrBusy", err)
	}
	plans := p.TakePlans(nil)
	if len(plans) != 2 || plans[0].Batch != 1 || plans[1].Index != 1 || !plans[0].ToSlab {
		t.Fatalf("plans %+v", plans)
	}
	if more := p.TakePlans(nil); len(more) != 0 {
		t.Fatalf("plans handed out twice: %+v", more)
	}
	cases := []struct {
		name  string
		batch tiers.BatchID
		index int
	}{
		{"unknown batch", 9, 0},
		{"index out of range", 1, 2},
		{"negative index", 1, -1},
	}
	for _, c := range cases {
		if err := p.Complete(c.batch, c.index, nil); !errors.Is(err, tiers.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", c.name, err)
		}
	}
	if err := p.Complete(1, 0, nil); err != nil {
		t.Fatal(err)
	}
	if err := p.Complete(1, 0, nil); !errors.Is(err, tiers.ErrInvalid) {
		t.Fatalf("second completion of one item: %v, want ErrInvalid", err)
	}
	if err := p.Complete(1, 1, errors.New("dma fault")); err != nil {
		t.Fatal(err)
	}
	acks := p.DrainAcks(nil)
	if len(acks) != 2 || acks[0].Stage != tiers.AckCopied || acks[1].Stage != tiers.AckFailed || !strings.Contains(acks[1].Err.Error(), "dma fault") {
		t.Fatalf("acks %+v", acks)
	}
	// Close fails what the engine never reported, in item order.
	id, err = p.CopyFromSlab(ctx, []tiers.PoolCopy{item(4), item(5)})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	acks = p.DrainAcks(nil)
	if len(acks) != 2 || acks[0].Batch != id || acks[0].Index != 0 || acks[1].Index != 1 {
		t.Fatalf("acks at close %+v", acks)
	}
	for _, a := range acks {
		if a.Stage != tiers.AckFailed || !errors.Is(a.Err, tiers.ErrClosed) {
			t.Fatalf("ack at close %+v, want failed with ErrClosed", a)
		}
	}
	if _, err := p.CopyFromSlab(ctx, []tiers.PoolCopy{item(6)}); !errors.Is(err, tiers.ErrClosed) {
		t.Fatalf("plan after close: %v", err)
	}
}

func TestEnginePoolFailedCopies(t *testing.T) {
	slab := testSlab()
	p, err := OpenEngine(testEnv(slab), EngineConfig{Pages: 8, Layers: 1, MaxPending: 16})
	if err != nil {
		t.Fatal(err)
	}
	e := startFakeEngine(t, p, slab)
	e.fail = func(pc PlannedCopy) error {
		if pc.Copy.Page == 3 {
			return errors.New("injected engine copy failure")
		}
		return nil
	}
	defer func() { e.halt(); p.Close() }()
	size := testPayload.Kinds[0].PageBytes
	var batch []tiers.PoolCopy
	for pg := range 5 {
		batch = append(batch, tiers.PoolCopy{Page: pg, Kind: 0, Span: tiers.Span{Offset: int64(pg) * size, Length: size}})
	}
	id, err := p.CopyToSlab(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	got := map[int]tiers.AckStage{}
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < len(batch) && time.Now().Before(deadline) {
		for _, a := range p.DrainAcks(nil) {
			if a.Batch == id {
				got[a.Index] = a.Stage
			}
		}
		time.Sleep(time.Millisecond)
	}
	for i := range batch {
		want := tiers.AckCopied
		if i == 3 {
			want = tiers.AckFailed
		}
		if got[i] != want {
			t.Errorf("item %d: %v, want %v", i, got[i], want)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	good := strings.Repeat("ab", 64)
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"host ok", ptr(DefaultHostConfig()).Validate(), ""},
		{"host no pages", (&HostConfig{Pages: 0, Layers: 1, Workers: 1}).Validate(), "pages 0"},
		{"host layers", (&HostConfig{Pages: 1, Layers: 5000, Workers: 1}).Validate(), "layers 5000"},
		{"host workers", (&HostConfig{Pages: 1, Layers: 1, Workers: 0}).Validate(), "workers 0"},
		{"engine ok", ptr(DefaultEngineConfig()).Validate(), ""},
		{"engine pending", (&EngineConfig{Pages: 1, Layers: 1}).Validate(), "max_pending 0"},
		{"cuda ok", ptr(DefaultCUDAConfig()).Validate(), ""},
		{"cuda handle ok", (&CUDAConfig{Pages: 1, Layers: 1, RegisterCeiling: 1 << 30, IPCHandles: []string{good}}).Validate(), ""},
		{"cuda short handle", (&CUDAConfig{Pages: 1, Layers: 1, RegisterCeiling: 1 << 30, IPCHandles: []string{"abcd"}}).Validate(), "ipc_handles[0]: handle of 4 hex digits"},
		{"cuda bad hex", (&CUDAConfig{Pages: 1, Layers: 1, RegisterCeiling: 1 << 30, IPCHandles: []string{strings.Repeat("zz", 64)}}).Validate(), "not hex"},
		{"cuda ceiling", (&CUDAConfig{Pages: 1, Layers: 1, RegisterCeiling: 4096}).Validate(), "register_ceiling 4KiB"},
		{"cuda device", (&CUDAConfig{Pages: 1, Layers: 1, RegisterCeiling: 1 << 30, Device: -1}).Validate(), "device -1"},
	}
	for _, c := range cases {
		switch {
		case c.want == "" && c.err != nil:
			t.Errorf("%s: %v", c.name, c.err)
		case c.want != "" && (c.err == nil || !strings.Contains(c.err.Error(), c.want)):
			t.Errorf("%s: %v, want an error containing %q", c.name, c.err, c.want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestLayoutRefusesUnevenLayers(t *testing.T) {
	_, err := OpenHost(testEnv(testSlab()), HostConfig{Pages: 4, Layers: 7, Workers: 1})
	if !errors.Is(err, tiers.ErrInvalid) || !strings.Contains(err.Error(), "does not split into 7 equal layer slices") {
		t.Fatalf("open with 7 layers: %v", err)
	}
	if _, err := OpenHost(tiers.Env{Logger: slog.New(slog.DiscardHandler), Payload: testPayload, WorldSize: 1}, DefaultHostConfig()); !errors.Is(err, tiers.ErrInvalid) {
		t.Fatalf("open without a slab: %v", err)
	}
}

// TestCUDAOpenFailsClearly runs everywhere: without a GPU (CI) the open
// must fail naming the library it looked for, never fall back.
func TestCUDAOpenFailsClearly(t *testing.T) {
	cfg := DefaultCUDAConfig()
	cfg.Library = "/nonexistent/kvtier-test/libcudart.so"
	_, err := OpenCUDA(testEnv(testSlab()), cfg)
	if !errors.Is(err, ErrNoCUDA) || !strings.Contains(err.Error(), cfg.Library) {
		t.Fatalf("open with a missing library: %v, want ErrNoCUDA naming %s", err, cfg.Library)
	}
	p, err := OpenCUDA(testEnv(testSlab()), DefaultCUDAConfig())
	if err == nil {
		p.Close()
		t.Skip("a CUDA runtime and device are present: the GPU check (scripts/gpu-check.sh) covers this machine")
	}
	msg := err.Error()
	if errors.Is(err, ErrNoCUDA) {
		for _, name := range DefaultCUDALibraries() {
			if !strings.Contains(msg, name) {
				t.Errorf("error does not name %s: %v", name, err)
			}
		}
	} else if !strings.Contains(msg, "l1 cuda pool") {
		t.Errorf("error does not say which tier failed: %v", err)
	}
}

func TestRegister(t *testing.T) {
	r := tiers.NewRegistry()
	if err := Register(r); err != nil {
		t.Fatal(err)
	}
	if got := r.Pools.Names(tiers.PoolV1); strings.Join(got, ",") != "cuda,engine,host" {
		t.Fatalf("pools %v", got)
	}
	reg, err := r.Pools.Lookup(tiers.PoolV1, "host")
	if err != nil {
		t.Fatal(err)
	}
	slab := testSlab()
	p, err := reg.Factory(context.Background(), testEnv(slab), &HostConfig{Pages: 4, Layers: 2, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	if g := p.Geometry(); g.Pages != 4 || g.Device != "host" {
		t.Fatalf("geometry %+v", g)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	bad, err := reg.Factory(context.Background(), testEnv(slab), &HostConfig{Pages: 0, Layers: 1, Workers: 1})
	if err == nil || bad != nil {
		t.Fatalf("factory with a bad config: %v, %v; want a nil pool and an error", bad, err)
	}
	if err := Register(r); err == nil {
		t.Fatal("registering twice succeeded")
	}
}

// FuzzCheck feeds arbitrary copy items to the batch check: it must never
// panic, and whatever it accepts must be in range.
func FuzzCheck(f *testing.F) {
	f.Add(0, uint8(0), int64(0), int64(testPayload.Kinds[0].PageBytes), uint32(0), false)
	f.Add(-1, uint8(3), int64(-5), int64(1), uint32(7), true)
	slab := testSlab()
	lay, err := newLayout(8, 4, testPayload)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, page int, kind uint8, off, length int64, slabID uint32, toSlab bool) {
		c := tiers.PoolCopy{Page: page, Kind: tiers.PayloadKind(kind), Span: tiers.Span{Slab: tiers.SlabID(slabID), Offset: off, Length: length}}
		if err := lay.check(slab, []tiers.PoolCopy{c, c}, toSlab); err == nil {
			if page < 0 || page >= 8 || int(kind) >= len(testPayload.Kinds) || length != testPayload.Kinds[kind].PageBytes {
				t.Fatalf("accepted %+v", c)
			}
			if !toSlab {
				t.Fatalf("accepted a CopyFromSlab batch writing %+v twice", c)
			}
		}
	})
}

// TestEnginePoolWholeBatches: an engine that reports plans whole
// (CompleteBatch) and an engine that goes away (FailPending): every item
// gets exactly one ack, the pool stays open for the next engine.
func TestEnginePoolWholeBatches(t *testing.T) {
	ctx := context.Background()
	slab := testSlab()
	p, err := OpenEngine(testEnv(slab), EngineConfig{Pages: 8, Layers: 1, MaxPending: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	size := testPayload.Kinds[0].PageBytes
	item := func(page int) tiers.PoolCopy {
		return tiers.PoolCopy{Page: page, Kind: 0, Span: tiers.Span{Offset: int64(page) * size, Length: size}}
	}
	a, _ := p.CopyToSlab(ctx, []tiers.PoolCopy{item(0), item(1), item(2)})
	b, _ := p.CopyFromSlab(ctx, []tiers.PoolCopy{item(3)})
	c, _ := p.CopyToSlab(ctx, []tiers.PoolCopy{item(4), item(5)})
	if !p.Outstanding(a) || p.Outstanding(99) {
		t.Fatal("Outstanding disagrees with the plans")
	}
	if err := p.Complete(a, 1, nil); err != nil {
		t.Fatal(err)
	}
	if err := p.CompleteBatch(a, nil); err != nil {
		t.Fatalf("the rest of batch %d: %v", a, err)
	}
	if err := p.CompleteBatch(a, nil); !errors.Is(err, tiers.ErrInvalid) {
		t.Fatalf("a batch reported twice: %v, want ErrInvalid", err)
	}
	if err := p.CompleteBatch(b, errors.New("engine copy failed")); err != nil {
		t.Fatal(err)
	}
	if n := p.FailPending(errors.New("engine gone")); n != 1 {
		t.Fatalf("FailPending failed %d batches, want 1 (batch %d)", n, c)
	}
	got := map[tiers.BatchID][]tiers.AckStage{}
	var order []int
	for _, ack := range p.DrainAcks(nil) {
		got[ack.Batch] = append(got[ack.Batch], ack.Stage)
		if ack.Batch == a {
			order = append(order, ack.Index)
		}
	}
	if len(got[a]) != 3 || len(got[b]) != 1 || got[b][0] != tiers.AckFailed || len(got[c]) != 2 || got[c][0] != tiers.AckFailed {
		t.Fatalf("acks %v", got)
	}
	if !slices.Equal(order, []int{1, 0, 2}) {
		t.Fatalf("batch %d acked in index order %v, want [1 0 2] (item 1 alone, then the rest in order)", a, order)
	}
	if st := p.Stats(); st.PagesToSlab != 3 || st.PagesFromSlab != 0 || st.BytesToSlab != 3*size {
		t.Fatalf("stats %+v: want batch %d's 3 pages copied to the slab and nothing failed counted", st, a)
	}
	// Every item is accounted: a batch of max_pending fits again.
	var full []tiers.PoolCopy
	for i := range 16 {
		full = append(full, item(i%8))
	}
	if _, err := p.CopyToSlab(ctx, full); err != nil {
		t.Fatalf("the pool refuses %d items with none outstanding: %v", len(full), err)
	}
	if _, err := p.CopyToSlab(ctx, []tiers.PoolCopy{item(6)}); !errors.Is(err, ErrBusy) {
		t.Fatalf("a plan past max_pending: %v, want ErrBusy", err)
	}
}

package pagestore

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	pb "github.com/kvtier/kvtier/api/storev1"
	"github.com/kvtier/kvtier/internal/slabfile"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/lru"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/memstore"
)

var testKinds = []tiers.PayloadSpec{{Name: "k", PageBytes: 8192}, {Name: "v", PageBytes: 8192}}

type harness struct {
	d    *Door
	slab tiers.Slab
	ms   *memstore.Store
}

// newHarness opens a door over a real slab (shm files) of about slots
// pages, with a memstore below it unless noStore, and wrap (fault
// injection) around the store when given.
func newHarness(t testing.TB, slots int, noStore bool, wrap func(tiers.Store) tiers.Store, lim Limits) *harness {
	t.Helper()
	ctx := context.Background()
	var per int64
	for _, k := range testKinds {
		per += k.PageBytes
	}
	slab, err := slabfile.Open(ctx, nil, t.TempDir(), "pagestore-test", int64(slots)*per, false)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{slab: slab}
	opt := Options{Slab: slab, Payload: tiers.PayloadGeometry{PageTokens: 16, Kinds: testKinds}, BootID: "boot-1",
		NewEvictor: func() (policy.Evictor, error) { return lru.New(policy.Options{}) }, StateDir: t.TempDir(), Limits: lim}
	if !noStore {
		env := tiers.Env{Logger: nopLog(), Payload: opt.Payload, WorldSize: 1, StackID: "pagestore-test", Slab: slab}
		h.ms, err = memstore.Open(env, memstore.Config{Capacity: 1 << 30})
		if err != nil {
			t.Fatal(err)
		}
		opt.Store, opt.StoreName = h.ms, "memstore"
		if wrap != nil {
			opt.Store = wrap(h.ms)
		}
	}
	h.d, err = Open(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = h.d.Stop()
		if h.ms != nil {
			_ = h.ms.Close()
		}
		_ = slab.Close()
	})
	return h
}

func testNS() *pb.Namespace {
	return &pb.Namespace{Model: "m", Dtype: "bfloat16", PageTokens: 16, TpSize: 1,
		Kinds: []*pb.PayloadKind{{Name: "k", PageBytes: 8192}, {Name: "v", PageBytes: 8192}}}
}

func (h *harness) register(t testing.TB) string {
	t.Helper()
	r, err := h.d.Register(context.Background(), &pb.RegisterRequest{ClientId: "t", Namespace: testNS(), ProtocolVersions: []uint32{1}})
	if err != nil {
		t.Fatal(err)
	}
	return r.GetSession()
}

// page returns key's test bytes for kind k.
func page(key string, k int, n int64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(len(key))*31+uint64(k), uint64(strings.Count(key, "")+k)))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	copy(b, fmt.Sprintf("%s/%d", key, k))
	return b
}

func (h *harness) bytesOf(t testing.TB, s *pb.Span) []byte {
	t.Helper()
	b, err := h.slab.Bytes(tiers.Span{Slab: tiers.SlabID(s.GetSlab()), Offset: int64(s.GetOffset()), Length: int64(s.GetLength())})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// set stores keys whole and returns the statuses.
func (h *harness) set(t testing.TB, ses string, keys ...string) []pb.SetStatus {
	t.Helper()
	ctx := context.Background()
	r, err := h.d.BatchSet(ctx, &pb.SetRequest{Session: ses, Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]pb.SetStatus, len(keys))
	written := make([]bool, len(keys))
	for i, p := range r.GetPages() {
		out[i] = p.GetStatus()
		if p.GetStatus() != pb.SetStatus_SET_STATUS_RESERVED {
			continue
		}
		for k, s := range p.GetSpans() {
			copy(h.bytesOf(t, s), page(keys[i], k, int64(s.GetLength())))
		}
		written[i] = true
	}
	if r.GetLease() != 0 {
		if _, err := h.d.Commit(ctx, &pb.CommitRequest{Session: ses, Lease: r.GetLease(), Written: written}); err != nil {
			t.Fatal(err)
		}
		// The checksums are taken off the Commit: the tests that poke the
		// door's state right after a set wait for them.
		h.d.mu.Lock()
		h.d.waitCommits()
		h.d.mu.Unlock()
	}
	return out
}

// get reads keys, checks every hit's bytes, releases, and returns the
// statuses.
func (h *harness) get(t testing.TB, ses string, deadlineMs uint32, keys ...string) []pb.GetStatus {
	t.Helper()
	ctx := context.Background()
	r, err := h.d.BatchGet(ctx, &pb.GetRequest{Session: ses, Keys: keys, DeadlineMs: deadlineMs})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]pb.GetStatus, len(keys))
	for i, p := range r.GetPages() {
		out[i] = p.GetStatus()
		if p.GetStatus() != pb.GetStatus_GET_STATUS_HIT {
			continue
		}
		for k, s := range p.GetSpans() {
			if !bytes.Equal(h.bytesOf(t, s), page(keys[i], k, int64(s.GetLength()))) {
				t.Fatalf("key %s kind %d: wrong bytes", keys[i], k)
			}
		}
	}
	if r.GetLease() != 0 {
		if _, err := h.d.Release(ctx, &pb.ReleaseRequest{Session: ses, Lease: r.GetLease()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.d.check(); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitEvictable waits until no write-through is pending.
func waitEvictable(t testing.TB, d *Door) {
	t.Helper()
	for range 5000 {
		if d.PendingPuts() == 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("write-through acks never came")
}

func nopLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// setPast sets n keys named prefix00, prefix01, ... four at a time, each
// batch written through to the store before the next, so that with a slab
// smaller than n the first ones end up in the store alone.
func (h *harness) setPast(t testing.TB, ses, prefix string, n int) []string {
	t.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%02d", prefix, i)
	}
	for i := 0; i < n; i += 4 {
		h.set(t, ses, keys[i:min(n, i+4)]...)
		waitEvictable(t, h.d)
	}
	return keys
}

package pagestore

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kvtier/kvtier/api/storev1"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

func TestRegisterRefuses(t *testing.T) {
	h := newHarness(t, 8, true, nil, Limits{})
	for _, c := range []struct {
		name string
		edit func(q *pb.RegisterRequest)
		code codes.Code
		want string
	}{
		{"no namespace", func(q *pb.RegisterRequest) { q.Namespace = nil }, codes.InvalidArgument, "namespace: missing"},
		{"no model", func(q *pb.RegisterRequest) { q.Namespace.Model = "" }, codes.InvalidArgument, "namespace.model"},
		{"long salt", func(q *pb.RegisterRequest) { q.Namespace.Salt = strings.Repeat("s", 300) }, codes.InvalidArgument, "namespace.salt"},
		{"kind count", func(q *pb.RegisterRequest) { q.Namespace.Kinds = q.Namespace.Kinds[:1] }, codes.InvalidArgument, "namespace.kinds: 1 payload kinds"},
		{"kind name", func(q *pb.RegisterRequest) { q.Namespace.Kinds[1].Name = "kv" }, codes.InvalidArgument, "namespace.kinds[1].name"},
		{"page bytes", func(q *pb.RegisterRequest) { q.Namespace.Kinds[0].PageBytes = 4096 }, codes.InvalidArgument, "namespace.kinds[0].page_bytes: 4096"},
		{"tp rank", func(q *pb.RegisterRequest) { q.Namespace.TpRank = 2; q.Namespace.TpSize = 2 }, codes.InvalidArgument, "namespace.tp_rank"},
		{"page tokens", func(q *pb.RegisterRequest) { q.Namespace.PageTokens = 0 }, codes.InvalidArgument, "namespace.page_tokens"},
		{"version", func(q *pb.RegisterRequest) { q.ProtocolVersions = []uint32{2} }, codes.FailedPrecondition, "protocol_versions"},
		{"no version", func(q *pb.RegisterRequest) { q.ProtocolVersions = nil }, codes.FailedPrecondition, "protocol_versions"},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := &pb.RegisterRequest{ClientId: "t", Namespace: testNS(), ProtocolVersions: []uint32{1}}
			c.edit(q)
			_, err := h.d.Register(context.Background(), q)
			if status.Code(err) != c.code || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %v naming %q", err, c.code, c.want)
			}
		})
	}
	r, err := h.d.Register(context.Background(), &pb.RegisterRequest{Namespace: testNS(), ProtocolVersions: []uint32{3, 1}})
	if err != nil {
		t.Fatal(err)
	}
	if r.GetLimits().GetSlabPages() != 8 || len(r.GetNamespaceId()) != 32 || r.GetBootId() != "boot-1" || len(r.GetKinds()) != 2 {
		t.Fatalf("register reply %v", r)
	}
	if _, err := h.d.BatchExists(context.Background(), &pb.ExistsRequest{Session: "nope", Keys: []string{"a"}}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown session: %v", err)
	}
}

func TestNamespaceIDs(t *testing.T) {
	base := namespaceID(testNS())
	for _, c := range []struct {
		name string
		edit func(n *pb.Namespace)
		same bool
	}{
		{"dp rank", func(n *pb.Namespace) { n.DpRank, n.DpSize = 1, 2 }, true},
		{"tp rank", func(n *pb.Namespace) { n.TpRank, n.TpSize = 1, 2 }, false},
		{"cp rank", func(n *pb.Namespace) { n.CpRank, n.CpSize = 1, 2 }, false},
		{"revision", func(n *pb.Namespace) { n.ModelRevision = "abc" }, false},
		{"dtype", func(n *pb.Namespace) { n.Dtype = "float8_e4m3fn" }, false},
		{"salt", func(n *pb.Namespace) { n.Salt = "x" }, false},
		{"string ends", func(n *pb.Namespace) { n.Model, n.Dtype = "mb", "float16" }, false},
	} {
		n := testNS()
		c.edit(n)
		if (namespaceID(n) == base) != c.same {
			t.Errorf("%s: same id %v, want %v", c.name, !c.same, c.same)
		}
	}
	// MLA: the TP ranks share pages.
	a, b := testNS(), testNS()
	a.SharedAcrossTp, b.SharedAcrossTp = true, true
	a.TpRank, a.TpSize, b.TpRank, b.TpSize = 0, 8, 5, 8
	if namespaceID(a) != namespaceID(b) {
		t.Error("shared_across_tp: TP ranks have different namespace ids")
	}
}

func TestRoundTripAndExists(t *testing.T) {
	h := newHarness(t, 16, false, nil, Limits{})
	ses := h.register(t)
	keys := []string{"a", "b", "c", "d"}
	for i, st := range h.set(t, ses, keys...) {
		if st != pb.SetStatus_SET_STATUS_RESERVED {
			t.Fatalf("key %d: %v", i, st)
		}
	}
	for i, st := range h.set(t, ses, "a", "e", "e", "") {
		want := []pb.SetStatus{pb.SetStatus_SET_STATUS_EXISTS, pb.SetStatus_SET_STATUS_RESERVED, pb.SetStatus_SET_STATUS_INVALID, pb.SetStatus_SET_STATUS_INVALID}[i]
		if st != want {
			t.Fatalf("second set key %d: %v, want %v", i, st, want)
		}
	}
	ex, err := h.d.BatchExists(context.Background(), &pb.ExistsRequest{Session: ses, Keys: []string{"a", "b", "e", "zz", "c"}})
	if err != nil {
		t.Fatal(err)
	}
	if ex.GetPresent() != 3 {
		t.Fatalf("present %d, want 3", ex.GetPresent())
	}
	for i, st := range h.get(t, ses, 0, "a", "b", "zz", "c", strings.Repeat("x", 2000)) {
		want := []pb.GetStatus{pb.GetStatus_GET_STATUS_HIT, pb.GetStatus_GET_STATUS_HIT, pb.GetStatus_GET_STATUS_MISS, pb.GetStatus_GET_STATUS_HIT, pb.GetStatus_GET_STATUS_INVALID}[i]
		if st != want {
			t.Fatalf("get key %d: %v, want %v", i, st, want)
		}
	}
	st := h.d.Snapshot()
	if st.GetStoredPages() != 5 || st.GetHitPagesL2() != 3 || st.GetExistsPages() != 1 || st.GetL2UsedPages() != 5 {
		t.Fatalf("stats %v", st)
	}
	// Clear: the namespace's pages are gone for every session.
	if _, err := h.d.Clear(context.Background(), &pb.ClearRequest{Session: ses}); err != nil {
		t.Fatal(err)
	}
	if got := h.get(t, ses, 0, "a")[0]; got != pb.GetStatus_GET_STATUS_MISS {
		t.Fatalf("after clear: %v", got)
	}
}

func TestDedupConcurrentSets(t *testing.T) {
	h := newHarness(t, 64, true, nil, Limits{})
	const clients = 8
	var wg sync.WaitGroup
	results := make([][]pb.SetStatus, clients)
	for c := range clients {
		ses := h.register(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[c] = h.set(t, ses, "k1", "k2", "k3")
		}()
	}
	wg.Wait()
	for k := range 3 {
		n := 0
		for c := range clients {
			if results[c][k] == pb.SetStatus_SET_STATUS_RESERVED {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("key %d reserved by %d clients, want 1", k, n)
		}
	}
	if used := h.d.Snapshot().GetL2UsedPages(); used != 3 {
		t.Fatalf("%d slab pages used, want 3 (one copy each)", used)
	}
	h.get(t, h.register(t), 0, "k1", "k2", "k3")
}

func TestSlabFull(t *testing.T) {
	h := newHarness(t, 4, true, nil, Limits{})
	ses := h.register(t)
	// A lease that pins everything: nothing can be evicted.
	r, err := h.d.BatchSet(context.Background(), &pb.SetRequest{Session: ses, Keys: []string{"a", "b", "c", "d", "e"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []pb.SetStatus{1, 1, 1, 1, pb.SetStatus_SET_STATUS_NO_SPACE}
	for i, p := range r.GetPages() {
		if p.GetStatus() != want[i] {
			t.Fatalf("key %d: %v, want %v", i, p.GetStatus(), want[i])
		}
	}
	// Uncommitted: not readable.
	if got := h.get(t, h.register(t), 0, "a")[0]; got != pb.GetStatus_GET_STATUS_MISS {
		t.Fatalf("reserved page read: %v", got)
	}
	c, err := h.d.Commit(context.Background(), &pb.CommitRequest{Session: ses, Lease: r.GetLease(), Written: []bool{true, false, true, true, false}})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(c.GetStored()) != "[true false true true false]" {
		t.Fatalf("stored %v", c.GetStored())
	}
	if err := h.d.check(); err != nil {
		t.Fatal(err)
	}
	// Without a store the committed pages are evictable at once: a new
	// set evicts the least recently used.
	if got := h.set(t, ses, "x", "y"); got[0] != pb.SetStatus_SET_STATUS_RESERVED || got[1] != pb.SetStatus_SET_STATUS_RESERVED {
		t.Fatalf("after commit: %v", got)
	}
	if h.d.Snapshot().GetEvictedPages() != 1 {
		t.Fatalf("evicted %d, want 1", h.d.Snapshot().GetEvictedPages())
	}
}

func TestReloadAfterEviction(t *testing.T) {
	h := newHarness(t, 8, false, nil, Limits{})
	ses := h.register(t)
	keys := h.setPast(t, ses, "p", 32)
	ex, err := h.d.BatchExists(context.Background(), &pb.ExistsRequest{Session: ses, Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	if ex.GetPresent() != 32 || ex.GetTiers()[0] != pb.Tier_TIER_L3 || ex.GetTiers()[31] != pb.Tier_TIER_L2 {
		t.Fatalf("exists %d %v", ex.GetPresent(), ex.GetTiers())
	}
	// A page only in the store is not written again: EXISTS.
	used := h.d.Snapshot().GetL2UsedPages()
	if got := h.set(t, ses, keys[0], keys[1], "new"); got[0] != pb.SetStatus_SET_STATUS_EXISTS || got[1] != pb.SetStatus_SET_STATUS_EXISTS || got[2] != pb.SetStatus_SET_STATUS_RESERVED {
		t.Fatalf("set of store-only pages: %v", got)
	}
	waitEvictable(t, h.d)
	if h.d.Snapshot().GetL2UsedPages() > used+1 {
		t.Fatalf("used %d slab pages, was %d", h.d.Snapshot().GetL2UsedPages(), used)
	}
	for i := 0; i < len(keys); i += 4 {
		for j, st := range h.get(t, ses, 5000, keys[i:i+4]...) {
			if st != pb.GetStatus_GET_STATUS_HIT {
				t.Fatalf("key %s: %v", keys[i+j], st)
			}
		}
	}
	if h.d.Snapshot().GetHitPagesL3() < 24 {
		t.Fatalf("stats %v", h.d.Snapshot())
	}
}

// blockingStore is a fault-injection fake: its Get waits until unblock
// is closed, the rest is the real memstore underneath.
type blockingStore struct {
	tiers.Store
	unblock chan struct{}
	started chan struct{}
}

func (b *blockingStore) Get(ctx context.Context, batch []tiers.GetRequest, res []error) error {
	select {
	case b.started <- struct{}{}:
	default:
	}
	<-b.unblock
	return b.Store.Get(ctx, batch, res)
}

func TestGetTimeoutKeepsSlotsUntilStoreReturns(t *testing.T) {
	bs := &blockingStore{unblock: make(chan struct{}), started: make(chan struct{}, 1)}
	h := newHarness(t, 4, false, func(s tiers.Store) tiers.Store { bs.Store = s; return bs }, Limits{})
	ses := h.register(t)
	keys := []string{"a", "b", "c", "d", "e", "f"}
	h.set(t, ses, keys[:4]...)
	waitEvictable(t, h.d)
	h.set(t, ses, keys[4:]...) // evicts a and b from L2
	waitEvictable(t, h.d)
	got := h.get(t, ses, 50, "a", "b")
	if got[0] != pb.GetStatus_GET_STATUS_TIMEOUT || got[1] != pb.GetStatus_GET_STATUS_TIMEOUT {
		t.Fatalf("blocked store: %v", got)
	}
	if h.d.Snapshot().GetTimeoutPages() != 2 {
		t.Fatalf("stats %v", h.d.Snapshot())
	}
	// The two reload slots stay held: two slots remain for sets (which
	// evict), never the reload's.
	h.d.mu.Lock()
	loading := h.d.loading
	h.d.mu.Unlock()
	if loading != 2 {
		t.Fatalf("loading %d, want 2", loading)
	}
	close(bs.unblock)
	for range 2000 {
		h.d.mu.Lock()
		loading = h.d.loading
		h.d.mu.Unlock()
		if loading == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	// The late reload was installed: the retry hits in L2.
	got = h.get(t, ses, 50, "a", "b")
	if got[0] != pb.GetStatus_GET_STATUS_HIT || got[1] != pb.GetStatus_GET_STATUS_HIT {
		t.Fatalf("after unblock: %v", got)
	}
}

func TestCorruptSlabPageIsAMiss(t *testing.T) {
	h := newHarness(t, 8, true, nil, Limits{})
	ses := h.register(t)
	h.set(t, ses, "a", "b")
	r, err := h.d.BatchGet(context.Background(), &pb.GetRequest{Session: ses, Keys: []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}
	span := r.GetPages()[0].GetSpans()[1]
	if _, err := h.d.Release(context.Background(), &pb.ReleaseRequest{Session: ses, Lease: r.GetLease()}); err != nil {
		t.Fatal(err)
	}
	h.bytesOf(t, span)[100] ^= 0xff // a client scribbles on a committed page
	got := h.get(t, ses, 0, "a", "b")
	if got[0] != pb.GetStatus_GET_STATUS_CORRUPT || got[1] != pb.GetStatus_GET_STATUS_HIT {
		t.Fatalf("got %v", got)
	}
	if got := h.get(t, ses, 0, "a")[0]; got != pb.GetStatus_GET_STATUS_MISS {
		t.Fatalf("dropped page: %v", got)
	}
	if h.d.Snapshot().GetCorruptPages() != 1 {
		t.Fatalf("stats %v", h.d.Snapshot())
	}
}

func TestLeaseExpiry(t *testing.T) {
	h := newHarness(t, 4, true, nil, Limits{Lease: time.Hour, SessionTTL: 2 * time.Hour})
	ses := h.register(t)
	h.set(t, ses, "a")
	g, err := h.d.BatchGet(context.Background(), &pb.GetRequest{Session: ses, Keys: []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := h.d.BatchSet(context.Background(), &pb.SetRequest{Session: ses, Keys: []string{"b", "c"}})
	if err != nil {
		t.Fatal(err)
	}
	copy(h.bytesOf(t, s.GetPages()[0].GetSpans()[0]), "torn")
	h.d.sweep(time.Now().Add(90 * time.Minute))
	if err := h.d.check(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Commit(context.Background(), &pb.CommitRequest{Session: ses, Lease: s.GetLease(), Written: []bool{true, true}}); status.Code(err) != codes.NotFound {
		t.Fatalf("commit after expiry: %v", err)
	}
	if _, err := h.d.Release(context.Background(), &pb.ReleaseRequest{Session: ses, Lease: g.GetLease()}); status.Code(err) != codes.NotFound {
		t.Fatalf("release after expiry: %v", err)
	}
	if got := h.get(t, ses, 0, "b", "c"); got[0] != pb.GetStatus_GET_STATUS_MISS || got[1] != pb.GetStatus_GET_STATUS_MISS {
		t.Fatalf("expired reservations readable: %v", got)
	}
	// The expired set's slots are quarantined a lease long: only "a"'s
	// slot and one free slot are usable now.
	if q := h.d.Gauges().Quarantined; q != 2 {
		t.Fatalf("quarantined %d, want 2", q)
	}
	h.d.sweep(time.Now().Add(3 * time.Hour))
	if _, err := h.d.BatchExists(context.Background(), &pb.ExistsRequest{Session: ses}); status.Code(err) != codes.NotFound {
		t.Fatalf("session past its ttl: %v", err)
	}
	if q := h.d.Gauges().Quarantined; q != 0 {
		t.Fatalf("quarantined %d after a lease, want 0", q)
	}
	if err := h.d.check(); err != nil {
		t.Fatal(err)
	}
}

func TestCloseEndsLeases(t *testing.T) {
	h := newHarness(t, 4, true, nil, Limits{})
	ses := h.register(t)
	s, err := h.d.BatchSet(context.Background(), &pb.SetRequest{Session: ses, Keys: []string{"a", "b", "c", "d"}})
	if err != nil {
		t.Fatal(err)
	}
	copy(h.bytesOf(t, s.GetPages()[0].GetSpans()[0]), "half")
	if _, err := h.d.Close(context.Background(), &pb.CloseRequest{Session: ses}); err != nil {
		t.Fatal(err)
	}
	other := h.register(t)
	if got := h.get(t, other, 0, "a")[0]; got != pb.GetStatus_GET_STATUS_MISS {
		t.Fatalf("closed session's reservation readable: %v", got)
	}
	if got := h.set(t, other, "w", "x", "y", "z"); got[3] != pb.SetStatus_SET_STATUS_RESERVED {
		t.Fatalf("slots not freed: %v", got)
	}
}

// heldAcks is a fault-injection fake: the real memstore underneath, but
// its acks reach the door only once release is closed (a store slow to
// gather).
type heldAcks struct {
	tiers.Store
	release chan struct{}
}

func (h *heldAcks) AckReady() <-chan struct{} {
	select {
	case <-h.release:
		return h.Store.AckReady()
	default:
		return h.release
	}
}

func (h *heldAcks) DrainAcks(dst []tiers.Ack) []tiers.Ack {
	select {
	case <-h.release:
		return h.Store.DrainAcks(dst)
	default:
		return dst
	}
}

func TestScribbleBeforeGatherNeverReachesTheStore(t *testing.T) {
	ha := &heldAcks{release: make(chan struct{})}
	h := newHarness(t, 8, false, func(s tiers.Store) tiers.Store { ha.Store = s; return ha }, Limits{})
	ses := h.register(t)
	h.set(t, ses, "a", "b")
	// A client writes into a's committed span before the store's ack:
	// the door checks the slab again once the store says it gathered.
	h.d.mu.Lock()
	k, _ := pageKey(h.d.sessions[ses].ns.id, 0, "a", nil)
	slot := h.d.entries[k].slot
	h.d.mu.Unlock()
	h.d.view(slot, 0)[7] ^= 0x80
	close(ha.release)
	waitEvictable(t, h.d)
	for range 2000 {
		if h.d.Snapshot().GetCorruptPages() == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if got := h.d.Snapshot().GetCorruptPages(); got != 1 {
		t.Fatalf("corrupt pages %d, want 1", got)
	}
	// Neither the slab nor the store answers with a's changed bytes.
	got := h.get(t, ses, 1000, "a", "b")
	if got[0] != pb.GetStatus_GET_STATUS_MISS || got[1] != pb.GetStatus_GET_STATUS_HIT {
		t.Fatalf("got %v", got)
	}
}

// TestConcurrentClients runs clients at once (sets, gets, releases,
// closes and re-registrations, a slab smaller than the working set, a
// store below) and checks every hit's bytes and the door's accounting at
// the end. Run it with -race.
func TestConcurrentClients(t *testing.T) {
	const seed = 24
	h := newHarness(t, 16, false, nil, Limits{})
	var wg sync.WaitGroup
	for c := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(c)))
			ctx := context.Background()
			ses := h.register(t)
			for op := range 150 {
				keys := make([]string, 1+r.IntN(6))
				for i := range keys {
					keys[i] = fmt.Sprintf("c%02d", r.IntN(40))
				}
				switch r.IntN(5) {
				case 0, 1:
					rs, err := h.d.BatchSet(ctx, &pb.SetRequest{Session: ses, Keys: keys})
					if err != nil {
						t.Errorf("seed %d client %d op %d: %v", seed, c, op, err)
						return
					}
					w := make([]bool, len(keys))
					for i, p := range rs.GetPages() {
						for k, s := range p.GetSpans() {
							copy(h.bytesOf(t, s), page(keys[i], k, int64(s.GetLength())))
							w[i] = true
						}
					}
					if rs.GetLease() != 0 {
						_, _ = h.d.Commit(ctx, &pb.CommitRequest{Session: ses, Lease: rs.GetLease(), Written: w})
					}
				case 2, 3:
					g, err := h.d.BatchGet(ctx, &pb.GetRequest{Session: ses, Keys: keys, DeadlineMs: 5000})
					if err != nil {
						t.Errorf("seed %d client %d op %d: %v", seed, c, op, err)
						return
					}
					for i, p := range g.GetPages() {
						if p.GetStatus() != pb.GetStatus_GET_STATUS_HIT {
							continue
						}
						for k, s := range p.GetSpans() {
							if !bytes.Equal(h.bytesOf(t, s), page(keys[i], k, int64(s.GetLength()))) {
								t.Errorf("seed %d client %d op %d: key %s kind %d: wrong bytes", seed, c, op, keys[i], k)
							}
						}
					}
					if g.GetLease() != 0 {
						_, _ = h.d.Release(ctx, &pb.ReleaseRequest{Session: ses, Lease: g.GetLease()})
					}
				case 4:
					if r.IntN(4) == 0 {
						_, _ = h.d.Close(ctx, &pb.CloseRequest{Session: ses})
						ses = h.register(t)
					} else {
						_, _ = h.d.BatchExists(ctx, &pb.ExistsRequest{Session: ses, Keys: keys})
					}
				}
			}
		}()
	}
	wg.Wait()
	waitEvictable(t, h.d)
	if err := h.d.check(); err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
}

func TestReloadNoSpaceWhenEveryPageIsPinned(t *testing.T) {
	h := newHarness(t, 4, false, nil, Limits{})
	ses := h.register(t)
	for _, ks := range [][]string{{"a", "b", "c", "d"}, {"e", "f"}} {
		h.set(t, ses, ks...)
		waitEvictable(t, h.d)
	}
	pins, err := h.d.BatchGet(context.Background(), &pb.GetRequest{Session: ses, Keys: []string{"c", "d", "e", "f"}})
	if err != nil || pins.GetLease() == 0 {
		t.Fatalf("pin: %v %v", pins, err)
	}
	got := h.get(t, ses, 1000, "a")
	if got[0] != pb.GetStatus_GET_STATUS_NO_SPACE {
		t.Fatalf("reload into a pinned slab: %v", got)
	}
	if _, err := h.d.Release(context.Background(), &pb.ReleaseRequest{Session: ses, Lease: pins.GetLease()}); err != nil {
		t.Fatal(err)
	}
	if got := h.get(t, ses, 1000, "a"); got[0] != pb.GetStatus_GET_STATUS_HIT {
		t.Fatalf("after release: %v", got)
	}
}

func TestGetOfAbsentKeysEvictsNothing(t *testing.T) {
	h := newHarness(t, 4, false, nil, Limits{})
	ses := h.register(t)
	h.set(t, ses, "a", "b", "c", "d")
	waitEvictable(t, h.d)
	h.set(t, ses, "e") // evicts a: in the store only now
	waitEvictable(t, h.d)
	before := h.d.Snapshot().GetEvictedPages()
	got := h.get(t, ses, 1000, "x", "y", "a", "z")
	want := []pb.GetStatus{pb.GetStatus_GET_STATUS_MISS, pb.GetStatus_GET_STATUS_MISS, pb.GetStatus_GET_STATUS_HIT, pb.GetStatus_GET_STATUS_MISS}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("get %v, want %v", got, want)
		}
	}
	if ev := h.d.Snapshot().GetEvictedPages() - before; ev != 1 {
		t.Fatalf("%d pages evicted, want 1 (for a's reload only)", ev)
	}
}

func TestKeyCacheBoundedAndPerGeneration(t *testing.T) {
	h := newHarness(t, 4, true, nil, Limits{})
	ses := h.register(t)
	s := h.d.sessions[ses]
	keys := make([]string, 1000)
	hs := make([]pagehash.Hash, len(keys))
	ok := make([]bool, len(keys))
	for round := range 20 {
		for i := range keys {
			keys[i] = fmt.Sprintf("r%d-%d", round, i)
		}
		h.d.hashKeys(s, keys, hs, ok)
		for i, k := range keys {
			if want, _ := pageKey(s.ns.id, 0, k, nil); hs[i] != want {
				t.Fatalf("round %d key %s: cached key differs", round, k)
			}
		}
		// Again: from the cache, the same keys.
		h.d.hashKeys(s, keys, hs, ok)
		if want, _ := pageKey(s.ns.id, 0, keys[7], nil); hs[7] != want {
			t.Fatalf("round %d: cache hit differs", round)
		}
		h.d.mu.Lock()
		n := len(s.ns.cache)
		h.d.mu.Unlock()
		if n > keyCacheSize {
			t.Fatalf("cache holds %d keys, bound %d", n, keyCacheSize)
		}
	}
	if _, err := h.d.Clear(context.Background(), &pb.ClearRequest{Session: ses}); err != nil {
		t.Fatal(err)
	}
	h.d.hashKeys(s, keys, hs, ok)
	if want, _ := pageKey(s.ns.id, 1, keys[0], nil); hs[0] != want {
		t.Fatal("after Clear the cache answered the old generation's key")
	}
}

package serve

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/kvtier/kvtier/api/enginev1"
	spb "github.com/kvtier/kvtier/api/storev1"
	"github.com/kvtier/kvtier/host/stack"
	"github.com/kvtier/kvtier/tiers"
)

// storeTestYAML is a small store stack: 16 KiB k and v payloads, a slab
// of 8 pages, a real l3disk with an LMDB index.
const storeTestYAML = `
version: 1
model:
  page_tokens: 16
  payloads:
    - {name: k, page_bytes: 16KiB}
    - {name: v, page_bytes: 16KiB}
tiers:
  - name: l2
    role: slab
    use: l2hugetlb
    # NB: the tests count the slab's 8 pages of 32 KiB; on hugetlbfs the
    # 256 KiB would round up to a 2 MiB page (64 slots), so the mount is a
    # directory that is never hugetlbfs: the shm fallback on every host.
    config: {size: 256KiB, mount: "{{DIR}}/not-hugetlbfs", fallback: shm, name: "kvtier-storetest-{{DIRHASH}}", stale: remove}
  - name: l3
    role: store
    use: l3disk
    index: {use: lmdb, config: {dir: "{{DIR}}/store/index"}}
    config:
      disks: [{dir: "{{DIR}}/store/l3", budget: 64MiB}]
policy:
  evictor: lru
write_policy: write_through
ranks: {world_size: 1, rank: 0}
`

func storeConfig(dir string, doors ...string) Config {
	return Config{DataDir: dir, SessionTTL: time.Minute, Doors: doors, StoreYAML: storeTestYAML, StoreConfigName: "store test stack"}
}

// storeClient is a test client of the store door: a gRPC channel of its
// own (its own connection) and the slab mapped as a client maps it.
type storeClient struct {
	t    testing.TB
	conn *grpc.ClientConn
	c    spb.StoreClient
	reg  *spb.RegisterReply
	maps [][]byte
}

func dialStore(t testing.TB, sock string) *storeClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	sc := &storeClient{t: t, conn: conn, c: spb.NewStoreClient(conn)}
	t.Cleanup(sc.close)
	return sc
}

func storeNS() *spb.Namespace {
	return &spb.Namespace{Model: "test-model", Dtype: "bfloat16", KvLayout: "page_first", PageTokens: 16, TpSize: 1,
		Kinds: []*spb.PayloadKind{{Name: "k", PageBytes: 16 << 10}, {Name: "v", PageBytes: 16 << 10}}}
}

func (sc *storeClient) register(ctx context.Context) {
	sc.t.Helper()
	r, err := sc.c.Register(ctx, &spb.RegisterRequest{ClientId: "test", Namespace: storeNS(), ProtocolVersions: []uint32{1}})
	if err != nil {
		sc.t.Fatal(err)
	}
	sc.reg = r
	sc.unmap()
	for _, f := range r.GetSlab().GetFiles() {
		fd, err := os.OpenFile(f.GetPath(), os.O_RDWR, 0)
		if err != nil {
			sc.t.Fatal(err)
		}
		b, err := unix.Mmap(int(fd.Fd()), 0, int(f.GetSize()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		fd.Close()
		if err != nil {
			sc.t.Fatal(err)
		}
		sc.maps = append(sc.maps, b)
	}
}

func (sc *storeClient) unmap() {
	for _, b := range sc.maps {
		_ = unix.Munmap(b)
	}
	sc.maps = nil
}

func (sc *storeClient) close() {
	sc.unmap()
	if sc.conn != nil {
		sc.conn.Close()
		sc.conn = nil
	}
}

func (sc *storeClient) bytes(s *spb.Span) []byte {
	m := sc.maps[s.GetSlab()]
	return m[s.GetOffset() : s.GetOffset()+s.GetLength()]
}

// pageBytes is key's deterministic content for kind k.
func pageBytes(key string, k int, n uint64) []byte {
	b := make([]byte, n)
	seed := uint64(0)
	for _, c := range key {
		seed = seed*131 + uint64(c)
	}
	r := rand.New(rand.NewPCG(seed, uint64(k)))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// set stores keys (writing every reserved span whole) and returns the
// statuses and Commit's stored flags.
func (sc *storeClient) set(ctx context.Context, keys ...string) ([]spb.SetStatus, []bool) {
	sc.t.Helper()
	r, err := sc.c.BatchSet(ctx, &spb.SetRequest{Session: sc.reg.GetSession(), Keys: keys})
	if err != nil {
		sc.t.Fatal(err)
	}
	sts := make([]spb.SetStatus, len(keys))
	w := make([]bool, len(keys))
	for i, p := range r.GetPages() {
		sts[i] = p.GetStatus()
		for k, s := range p.GetSpans() {
			copy(sc.bytes(s), pageBytes(keys[i], k, s.GetLength()))
			w[i] = true
		}
	}
	if r.GetLease() == 0 {
		return sts, nil
	}
	c, err := sc.c.Commit(ctx, &spb.CommitRequest{Session: sc.reg.GetSession(), Lease: r.GetLease(), Written: w})
	if err != nil {
		sc.t.Fatal(err)
	}
	return sts, c.GetStored()
}

// get reads keys, compares every hit's bytes, releases, and returns the
// statuses and the number of wrong bytes.
func (sc *storeClient) get(ctx context.Context, deadlineMs uint32, keys ...string) ([]spb.GetStatus, int) {
	sc.t.Helper()
	r, err := sc.c.BatchGet(ctx, &spb.GetRequest{Session: sc.reg.GetSession(), Keys: keys, DeadlineMs: deadlineMs})
	if err != nil {
		sc.t.Fatal(err)
	}
	sts := make([]spb.GetStatus, len(keys))
	wrong := 0
	for i, p := range r.GetPages() {
		sts[i] = p.GetStatus()
		if p.GetStatus() != spb.GetStatus_GET_STATUS_HIT {
			continue
		}
		for k, s := range p.GetSpans() {
			got, want := sc.bytes(s), pageBytes(keys[i], k, s.GetLength())
			for j := range got {
				if got[j] != want[j] {
					wrong++
				}
			}
		}
	}
	if r.GetLease() != 0 {
		if _, err := sc.c.Release(ctx, &spb.ReleaseRequest{Session: sc.reg.GetSession(), Lease: r.GetLease()}); err != nil {
			sc.t.Fatal(err)
		}
	}
	return sts, wrong
}

func countStatus[T comparable](sts []T, want T) int {
	n := 0
	for _, s := range sts {
		if s == want {
			n++
		}
	}
	return n
}

func keyList(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%064x", prefix, i)
	}
	return out
}

// waitPuts waits until the door's write-through is gathered, so its
// pages are evictable.
func waitPuts(t testing.TB, s *Server) {
	t.Helper()
	for range 5000 {
		if s.StoreDoor().PendingPuts() == 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("write-through never gathered")
}

func TestStoreDoorRegisterAndRoundTrip(t *testing.T) {
	ctx := context.Background()
	s, sock, _ := startWith(t, storeConfig(t.TempDir(), DoorStore))
	if s.Ranks() != 0 {
		t.Fatalf("store door only: %d engine ranks, want 0", s.Ranks())
	}
	sc := dialStore(t, sock)
	for _, c := range []struct {
		name string
		edit func(n *spb.Namespace)
		want string
	}{
		{"kinds", func(n *spb.Namespace) { n.Kinds = n.Kinds[:1] }, "namespace.kinds: 1 payload kinds"},
		{"page bytes", func(n *spb.Namespace) { n.Kinds[1].PageBytes = 4096 }, "namespace.kinds[1].page_bytes: 4096"},
		{"model", func(n *spb.Namespace) { n.Model = "" }, "namespace.model"},
	} {
		n := storeNS()
		c.edit(n)
		_, err := sc.c.Register(ctx, &spb.RegisterRequest{Namespace: n, ProtocolVersions: []uint32{1}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want InvalidArgument naming %q", c.name, err, c.want)
		}
	}
	// The engine door is off: its calls are unimplemented.
	if _, err := pb.NewEngineClient(sc.conn).Health(ctx, &pb.HealthRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("engine door off: %v", err)
	}
	sc.register(ctx)
	if sc.reg.GetBootId() != s.BootID() || sc.reg.GetLimits().GetSlabPages() != 8 || strings.Join(sc.reg.GetTiers(), ",") != "l2,l3" {
		t.Fatalf("register reply %v", sc.reg)
	}
	keys := keyList("rt", 4)
	if sts, stored := sc.set(ctx, keys...); countStatus(sts, spb.SetStatus_SET_STATUS_RESERVED) != 4 || countStatus(stored, true) != 4 {
		t.Fatalf("set %v stored %v", sts, stored)
	}
	ex, err := sc.c.BatchExists(ctx, &spb.ExistsRequest{Session: sc.reg.GetSession(), Keys: append(keys[:2:2], "absent", keys[2])})
	if err != nil {
		t.Fatal(err)
	}
	if ex.GetPresent() != 2 || ex.GetBootId() != s.BootID() || ex.GetTiers()[0] != spb.Tier_TIER_L2 {
		t.Fatalf("exists %v", ex)
	}
	sts, wrong := sc.get(ctx, 0, keys...)
	if countStatus(sts, spb.GetStatus_GET_STATUS_HIT) != 4 || wrong != 0 {
		t.Fatalf("get %v, %d wrong bytes", sts, wrong)
	}
	// Another client of the same namespace sees the pages; one of
	// another namespace (salt) does not.
	other := dialStore(t, sock)
	other.register(ctx)
	if sts, wrong := other.get(ctx, 0, keys[0]); sts[0] != spb.GetStatus_GET_STATUS_HIT || wrong != 0 {
		t.Fatalf("second client: %v, %d wrong", sts, wrong)
	}
	salted := storeNS()
	salted.Salt = "tenant-b"
	r, err := other.c.Register(ctx, &spb.RegisterRequest{Namespace: salted, ProtocolVersions: []uint32{1}})
	if err != nil {
		t.Fatal(err)
	}
	g, err := other.c.BatchGet(ctx, &spb.GetRequest{Session: r.GetSession(), Keys: keys[:1]})
	if err != nil || g.GetPages()[0].GetStatus() != spb.GetStatus_GET_STATUS_MISS {
		t.Fatalf("salted namespace: %v %v", g, err)
	}
	st, err := sc.c.Stats(ctx, &spb.StatsRequest{Session: sc.reg.GetSession()})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetStoredPages() != 4 || st.GetHitPagesL2() != 5 || st.GetL2CapacityPages() != 8 {
		t.Fatalf("stats %v", st)
	}
	// kvtier_store_* reach the metrics registry.
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "kvtier_store_get_pages_total" {
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == "hit_l2" && m.GetCounter().GetValue() == 5 {
					found = true
				}
			}
		}
	}
	if !found {
		t.Fatal("kvtier_store_get_pages_total{outcome=hit_l2} is not 5")
	}
}

func TestStoreDoorBesideEngineDoor(t *testing.T) {
	ctx := context.Background()
	s, sock, _ := startWith(t, storeConfig(t.TempDir(), DoorEngine, DoorStore))
	e := dialEngine(t, sock, 0, 1)
	h, err := e.cl.Health(ctx, &pb.HealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sc := dialStore(t, sock)
	sc.register(ctx)
	if h.GetBootId() != sc.reg.GetBootId() || s.Ranks() != 1 {
		t.Fatalf("boot ids %q and %q, %d ranks", h.GetBootId(), sc.reg.GetBootId(), s.Ranks())
	}
	if sts, _ := sc.set(ctx, "a"); sts[0] != spb.SetStatus_SET_STATUS_RESERVED {
		t.Fatalf("set %v", sts)
	}
}

func TestStoreDoorReloadAndRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, sock, stop := startWith(t, storeConfig(dir, DoorStore))
	sc := dialStore(t, sock)
	sc.register(ctx)
	keys := keyList("ws", 32) // 4x the slab
	for i := 0; i < len(keys); i += 4 {
		if sts, _ := sc.set(ctx, keys[i:i+4]...); countStatus(sts, spb.SetStatus_SET_STATUS_RESERVED) != 4 {
			t.Fatalf("set %d: %v", i, sts)
		}
		waitPuts(t, s)
	}
	ex, err := sc.c.BatchExists(ctx, &spb.ExistsRequest{Session: sc.reg.GetSession(), Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	if ex.GetPresent() != 32 || ex.GetTiers()[0] != spb.Tier_TIER_L3 {
		t.Fatalf("exists %d %v", ex.GetPresent(), ex.GetTiers())
	}
	for i := 0; i < len(keys); i += 4 {
		sts, wrong := sc.get(ctx, 10000, keys[i:i+4]...)
		if countStatus(sts, spb.GetStatus_GET_STATUS_HIT) != 4 || wrong != 0 {
			t.Fatalf("get %d: %v, %d wrong bytes", i, sts, wrong)
		}
	}
	if st := s.StoreDoor().Snapshot(); st.GetHitPagesL3() < 24 || st.GetEvictedPages() == 0 {
		t.Fatalf("stats %v", st)
	}
	old := sc.reg.GetSession()
	boot := s.BootID()
	// Every page is durable once the store drained: stop and start again.
	stop()
	sc.close()
	s2, sock2, _ := startWith(t, storeConfig(dir, DoorStore))
	if s2.BootID() == boot {
		t.Fatal("same boot id after a restart")
	}
	sc2 := dialStore(t, sock2)
	if _, err := sc2.c.BatchExists(ctx, &spb.ExistsRequest{Session: old, Keys: keys}); status.Code(err) != codes.NotFound {
		t.Fatalf("old session after restart: %v", err)
	}
	sc2.register(ctx)
	ex, err = sc2.c.BatchExists(ctx, &spb.ExistsRequest{Session: sc2.reg.GetSession(), Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	if ex.GetPresent() != 32 || ex.GetTiers()[31] != spb.Tier_TIER_L3 {
		t.Fatalf("after restart: exists %d %v", ex.GetPresent(), ex.GetTiers())
	}
	sts, wrong := sc2.get(ctx, 10000, keys[:8]...)
	if countStatus(sts, spb.GetStatus_GET_STATUS_HIT) != 8 || wrong != 0 {
		t.Fatalf("after restart: %v, %d wrong bytes", sts, wrong)
	}
	// Clear survives a restart too: the namespace's generation is kept.
	if _, err := sc2.c.Clear(ctx, &spb.ClearRequest{Session: sc2.reg.GetSession()}); err != nil {
		t.Fatal(err)
	}
	ex, err = sc2.c.BatchExists(ctx, &spb.ExistsRequest{Session: sc2.reg.GetSession(), Keys: keys})
	if err != nil || ex.GetPresent() != 0 {
		t.Fatalf("after clear: %v %v", ex, err)
	}
}

func TestStoreDoorDisconnectMidSet(t *testing.T) {
	ctx := context.Background()
	s, sock, _ := startWith(t, storeConfig(t.TempDir(), DoorStore))
	sc := dialStore(t, sock)
	sc.register(ctx)
	keys := keyList("torn", 8)
	r, err := sc.c.BatchSet(ctx, &spb.SetRequest{Session: sc.reg.GetSession(), Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	if countStatus(pageStatuses(r), spb.SetStatus_SET_STATUS_RESERVED) != 8 {
		t.Fatalf("set %v", r)
	}
	// Half of the first page written, then the client dies.
	sp := r.GetPages()[0].GetSpans()[0]
	copy(sc.bytes(sp)[:sp.GetLength()/2], pageBytes(keys[0], 0, sp.GetLength()/2))
	sc.close()
	for i := 0; s.StoreDoor().Gauges().Sessions != 0; i++ {
		if i > 5000 {
			t.Fatal("the dropped connection's session never ended")
		}
		time.Sleep(time.Millisecond)
	}
	other := dialStore(t, sock)
	other.register(ctx)
	sts, wrong := other.get(ctx, 1000, keys...)
	if countStatus(sts, spb.GetStatus_GET_STATUS_HIT) != 0 || wrong != 0 {
		t.Fatalf("torn pages readable: %v", sts)
	}
	// The reservations were freed: the whole slab is reservable again.
	if sts, _ := other.set(ctx, keyList("after", 8)...); countStatus(sts, spb.SetStatus_SET_STATUS_RESERVED) != 8 {
		t.Fatalf("after the disconnect: %v", sts)
	}
}

func pageStatuses(r *spb.SetReply) []spb.SetStatus {
	var out []spb.SetStatus
	for _, p := range r.GetPages() {
		out = append(out, p.GetStatus())
	}
	return out
}

func TestStoreDoorDedupAndSlabFull(t *testing.T) {
	ctx := context.Background()
	_, sock, _ := startWith(t, storeConfig(t.TempDir(), DoorStore))
	const clients = 4
	cs := make([]*storeClient, clients)
	for i := range cs {
		cs[i] = dialStore(t, sock)
		cs[i].register(ctx)
	}
	keys := keyList("dup", 3)
	var wg sync.WaitGroup
	res := make([][]spb.SetStatus, clients)
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.c.BatchSet(ctx, &spb.SetRequest{Session: c.reg.GetSession(), Keys: keys})
			if err != nil {
				t.Error(err)
				return
			}
			res[i] = pageStatuses(r)
			w := make([]bool, len(keys))
			for j, p := range r.GetPages() {
				for k, s := range p.GetSpans() {
					copy(c.bytes(s), pageBytes(keys[j], k, s.GetLength()))
					w[j] = true
				}
			}
			if r.GetLease() != 0 {
				if _, err := c.c.Commit(ctx, &spb.CommitRequest{Session: c.reg.GetSession(), Lease: r.GetLease(), Written: w}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	for k := range keys {
		n := 0
		for i := range cs {
			if res[i][k] == spb.SetStatus_SET_STATUS_RESERVED {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("key %d reserved by %d clients, want 1: %v", k, n, res)
		}
	}
	if sts, wrong := cs[0].get(ctx, 0, keys...); countStatus(sts, spb.GetStatus_GET_STATUS_HIT) != 3 || wrong != 0 {
		t.Fatalf("dedup get %v, %d wrong", sts, wrong)
	}
	// Slab full: a lease holding the other 5 slots, then one more set.
	r, err := cs[1].c.BatchSet(ctx, &spb.SetRequest{Session: cs[1].reg.GetSession(), Keys: keyList("hold", 5)})
	if err != nil {
		t.Fatal(err)
	}
	pins, err := cs[2].c.BatchGet(ctx, &spb.GetRequest{Session: cs[2].reg.GetSession(), Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	if countStatus(pageStatuses(r), spb.SetStatus_SET_STATUS_RESERVED) != 5 || pins.GetLease() == 0 {
		t.Fatalf("hold: %v, pins %v", r, pins)
	}
	sts, _ := cs[3].set(ctx, keyList("full", 2)...)
	if countStatus(sts, spb.SetStatus_SET_STATUS_NO_SPACE) != 2 {
		t.Fatalf("full slab: %v", sts)
	}
}

// blockedStore is a fault-injection fake around the real l3disk store:
// its Get waits until unblock is closed.
type blockedStore struct {
	tiers.Store
	unblock chan struct{}
}

func (b *blockedStore) Get(ctx context.Context, batch []tiers.GetRequest, res []error) error {
	<-b.unblock
	return b.Store.Get(ctx, batch, res)
}

func TestStoreDoorBlockedStoreTimesOut(t *testing.T) {
	ctx := context.Background()
	bs := &blockedStore{unblock: make(chan struct{})}
	cfg := storeConfig(t.TempDir(), DoorStore)
	cfg.StoreStores = func(_ context.Context, st *stack.Stack) (func() error, error) {
		bs.Store = st.Stores[0].Store
		st.Stores[0].Store = bs
		return func() error {
			select {
			case <-bs.unblock:
			default:
				close(bs.unblock)
			}
			return nil
		}, nil
	}
	s, sock, _ := startWith(t, cfg)
	sc := dialStore(t, sock)
	sc.register(ctx)
	keys := keyList("blk", 16)
	for i := 0; i < len(keys); i += 4 {
		sc.set(ctx, keys[i:i+4]...)
		waitPuts(t, s)
	}
	// keys[0:8] are only in L3 now; the store's reads hang.
	sts, wrong := sc.get(ctx, 100, keys[:4]...)
	if countStatus(sts, spb.GetStatus_GET_STATUS_TIMEOUT) != 4 || wrong != 0 {
		t.Fatalf("blocked store: %v", sts)
	}
	if st := s.StoreDoor().Snapshot(); st.GetTimeoutPages() != 4 {
		t.Fatalf("stats %v", st)
	}
	// The L2 pages still hit, never blocked behind the store.
	if sts, wrong := sc.get(ctx, 100, keys[12:]...); countStatus(sts, spb.GetStatus_GET_STATUS_HIT) != 4 || wrong != 0 {
		t.Fatalf("l2 pages: %v, %d wrong", sts, wrong)
	}
	close(bs.unblock)
	for i := 0; s.StoreDoor().Gauges().Loading != 0; i++ {
		if i > 5000 {
			t.Fatal("the late reload never finished")
		}
		time.Sleep(time.Millisecond)
	}
	if sts, wrong := sc.get(ctx, 5000, keys[:4]...); countStatus(sts, spb.GetStatus_GET_STATUS_HIT) != 4 || wrong != 0 {
		t.Fatalf("after unblock: %v, %d wrong", sts, wrong)
	}
}

func TestStoreDoorCorruptSlabPage(t *testing.T) {
	ctx := context.Background()
	s, sock, _ := startWith(t, storeConfig(t.TempDir(), DoorStore))
	sc := dialStore(t, sock)
	sc.register(ctx)
	keys := keyList("crc", 2)
	sc.set(ctx, keys...)
	waitPuts(t, s)
	r, err := sc.c.BatchGet(ctx, &spb.GetRequest{Session: sc.reg.GetSession(), Keys: keys[:1]})
	if err != nil {
		t.Fatal(err)
	}
	b := sc.bytes(r.GetPages()[0].GetSpans()[0])
	if _, err := sc.c.Release(ctx, &spb.ReleaseRequest{Session: sc.reg.GetSession(), Lease: r.GetLease()}); err != nil {
		t.Fatal(err)
	}
	b[4096] ^= 1 // a client writes into a committed page
	sts, wrong := sc.get(ctx, 1000, keys...)
	if sts[0] != spb.GetStatus_GET_STATUS_CORRUPT || sts[1] != spb.GetStatus_GET_STATUS_HIT || wrong != 0 {
		t.Fatalf("corrupt page: %v, %d wrong", sts, wrong)
	}
	// The slab copy was dropped; the store's copy (written through
	// before the scribble) comes back verified.
	if sts, wrong := sc.get(ctx, 5000, keys[0]); sts[0] != spb.GetStatus_GET_STATUS_HIT || wrong != 0 {
		t.Fatalf("after corrupt: %v, %d wrong", sts, wrong)
	}
}

func TestStoreDoorLeaseExpiry(t *testing.T) {
	ctx := context.Background()
	cfg := storeConfig(t.TempDir(), DoorStore)
	cfg.StoreLimits.Lease = 200 * time.Millisecond
	s, sock, _ := startWith(t, cfg)
	sc := dialStore(t, sock)
	sc.register(ctx)
	r, err := sc.c.BatchSet(ctx, &spb.SetRequest{Session: sc.reg.GetSession(), Keys: keyList("late", 2)})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; s.StoreDoor().Gauges().Leases != 0; i++ {
		if i > 10000 {
			t.Fatal("the lease never expired")
		}
		time.Sleep(time.Millisecond)
	}
	_, err = sc.c.Commit(ctx, &spb.CommitRequest{Session: sc.reg.GetSession(), Lease: r.GetLease(), Written: []bool{true, true}})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("commit after expiry: %v", err)
	}
	if sts, _ := sc.get(ctx, 1000, keyList("late", 2)...); countStatus(sts, spb.GetStatus_GET_STATUS_HIT) != 0 {
		t.Fatalf("expired reservations readable: %v", sts)
	}
}

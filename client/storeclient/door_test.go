package storeclient_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	pb "github.com/kvtier/kvtier/api/storev1"
	"github.com/kvtier/kvtier/client/storeclient"
	"github.com/kvtier/kvtier/host/serve"
)

// doorYAML is a small store stack: 16 KiB k and v payloads, a slab of 16
// pages, a real l3disk with an LMDB index.
const doorYAML = `
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
    config: {size: 512KiB, fallback: shm, name: "kvtier-storeclient-{{DIRHASH}}", stale: remove}
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

// startDoor runs a real kvtier serve with only the store door, over a
// new unix socket, with dir as its data dir; stop ends it.
func startDoor(t *testing.T, dir string) (sock string, stop func(), s *serve.Server) {
	t.Helper()
	sd, err := os.MkdirTemp("", "kvsc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sd) })
	return startDoorAt(t, dir, filepath.Join(sd, "s.sock"))
}

func namespace() *pb.Namespace {
	return &pb.Namespace{Model: "storeclient-model", Dtype: "bfloat16", KvLayout: "page_first", PageTokens: 16, TpSize: 1,
		Kinds: []*pb.PayloadKind{{Name: "k", PageBytes: 16 << 10}, {Name: "v", PageBytes: 16 << 10}}}
}

// page fills the bytes of key's kind k deterministically.
func page(key string, k int, n int) []byte {
	r := rand.New(rand.NewPCG(uint64(len(key))*7919+uint64(k), uint64(key[len(key)-1])))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	copy(b, key)
	return b
}

// TestClientAgainstDoor drives the client through a real serve: set,
// copy, commit, exists, get with every byte checked, release, dedup,
// stats, then a restart of serve (a new boot_id): the client registers
// again by itself and finds the durable pages in L3.
func TestClientAgainstDoor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	sock, stop, srv := startDoor(t, dir)
	c, err := storeclient.Dial(ctx, storeclient.Options{Socket: sock, ClientID: "test", Namespace: namespace()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	const pb16 = 16 << 10
	keys := make([]string, 8)
	for i := range keys {
		keys[i] = fmt.Sprintf("%064x", i+1)
	}
	rs, err := c.Set(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	written := make([]bool, len(keys))
	for i, st := range rs.Status {
		if st != pb.SetStatus_SET_STATUS_RESERVED || len(rs.Spans[i]) != 2 {
			t.Fatalf("set %d: %v with %d spans, want RESERVED with 2", i, st, len(rs.Spans[i]))
		}
		for k, sp := range rs.Spans[i] {
			copy(sp, page(keys[i], k, pb16))
		}
		written[i] = true
	}
	stored, err := c.Commit(ctx, rs, written)
	if err != nil {
		t.Fatal(err)
	}
	for i, ok := range stored {
		if !ok {
			t.Fatalf("commit: key %d not stored", i)
		}
	}
	// A second set of the same keys writes nothing: one copy is kept.
	again, err := c.Set(ctx, keys[:2])
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range again.Status {
		if st != pb.SetStatus_SET_STATUS_EXISTS {
			t.Fatalf("second set %d: %v, want EXISTS", i, st)
		}
	}
	if _, err := c.Commit(ctx, again, make([]bool, 2)); err != nil {
		t.Fatal(err)
	}
	n, tiers, err := c.Exists(ctx, append(keys, fmt.Sprintf("%064x", 999)))
	if err != nil || n != len(keys) || len(tiers) != n {
		t.Fatalf("exists: %d pages, tiers %v, err %v; want %d", n, tiers, err, len(keys))
	}
	check := func(what string, want pb.GetStatus) {
		t.Helper()
		g, err := c.Get(ctx, keys, 5000)
		if err != nil {
			t.Fatalf("%s: get: %v", what, err)
		}
		for i, st := range g.Status {
			if st != want {
				t.Fatalf("%s: get %d: %v, want %v", what, i, st, want)
			}
			for k, sp := range g.Spans[i] {
				if !bytes.Equal(sp, page(keys[i], k, pb16)) {
					t.Fatalf("%s: key %d kind %d: wrong bytes", what, i, k)
				}
			}
		}
		if err := c.Release(ctx, g); err != nil {
			t.Fatalf("%s: release: %v", what, err)
		}
	}
	check("from L2", pb.GetStatus_GET_STATUS_HIT)
	st, err := c.Stats(ctx)
	if err != nil || st.GetStoredPages() < uint64(len(keys)) || st.GetHitPagesL2() < uint64(len(keys)) {
		t.Fatalf("stats %v, err %v: want %d stored and L2 hits", st, err, len(keys))
	}
	// Wait until the write-through is durable, then restart serve.
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := c.Stats(ctx)
		if err == nil && st.GetL2UsedPages() >= uint64(len(keys)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pages not in L2: %v %v", st, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The write-through has reached the l3disk (gathered); a graceful
	// stop makes it durable.
	for srv.StoreDoor().PendingPuts() > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the write-through did not land within 20 s")
		}
		time.Sleep(time.Millisecond)
	}
	stop()
	sock2, _, _ := startDoorAt(t, dir, sock)
	if sock2 != sock {
		t.Fatalf("restarted on %s, not %s", sock2, sock)
	}
	// The first call sees the new boot_id: the client registers again and
	// says so. An exists with prefetch and a wait answers once the
	// prefetch's reloads landed: the pages it prefetched (at most a
	// quarter of the slab at once) are in L2, the rest in L3.
	for range 50 {
		n, tiers, err = c.ExistsWith(ctx, keys, storeclient.ExistsOptions{Prefetch: true, Wait: 10 * time.Second})
		if err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || n != len(keys) {
		t.Fatalf("exists after the restart: %d present, err %v", n, err)
	}
	st, err = c.Stats(ctx)
	if err != nil || st.GetPrefetchPages() == 0 {
		t.Fatalf("stats after the prefetch %v, err %v: want pages prefetched", st, err)
	}
	for i, tier := range tiers {
		want := pb.Tier_TIER_L3
		if uint64(i) < st.GetPrefetchPages() {
			want = pb.Tier_TIER_L2
		}
		if tier != want {
			t.Fatalf("exists with a wait after the restart: page %d in %v, want %v (%v; %d prefetched)", i, tier, want, tiers, st.GetPrefetchPages())
		}
	}
	// The pages come back from L3.
	var g *storeclient.Got
	for range 50 {
		g, err = c.Get(ctx, keys, 5000)
		if err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("get after the restart: %v", err)
	}
	_ = c.Release(ctx, g)
	check("after the restart", pb.GetStatus_GET_STATUS_HIT)
}

// startDoorAt starts serve over dir on the socket path sock (a restart
// reuses the path); stop ends it, once.
func startDoorAt(t *testing.T, dir, sock string) (string, func(), *serve.Server) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := serve.Open(ctx, serve.Config{DataDir: dir, Socket: sock, Doors: []string{serve.DoorStore}, StoreYAML: doorYAML, StoreConfigName: "storeclient test stack"})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	select {
	case <-s.Listening():
	case err := <-done:
		t.Fatalf("serve stopped before listening: %v", err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("serve: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return sock, stop, s
}

// TestClientCheckAtRelease: with Options.CheckAtRelease, Get answers
// before the door checked the hits and Release turns the hits that failed
// into GET_STATUS_CORRUPT, here a page another client scribbled on.
func TestClientCheckAtRelease(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sock, stop, _ := startDoor(t, t.TempDir())
	defer stop()
	c, err := storeclient.Dial(ctx, storeclient.Options{Socket: sock, ClientID: "checked", Namespace: namespace(), CheckAtRelease: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	const pb16 = 16 << 10
	keys := []string{fmt.Sprintf("%064x", 101), fmt.Sprintf("%064x", 102), fmt.Sprintf("%064x", 103)}
	rs, err := c.Set(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		for k, sp := range rs.Spans[i] {
			copy(sp, page(keys[i], k, pb16))
		}
	}
	if _, err := c.Commit(ctx, rs, []bool{true, true, true}); err != nil {
		t.Fatal(err)
	}
	// A client of the check-first kind scribbles on key 1's committed page
	// through its own mapping, after its check passed.
	w, err := storeclient.Dial(ctx, storeclient.Options{Socket: sock, ClientID: "scribbler", Namespace: namespace()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	for _, scribble := range []bool{false, true} {
		if scribble {
			wg, err := w.Get(ctx, keys[1:2], 5000)
			if err != nil || wg.Status[0] != pb.GetStatus_GET_STATUS_HIT {
				t.Fatalf("scribbler's get: %v %v", wg, err)
			}
			wg.Spans[0][1][77] ^= 0xff
			if err := w.Release(ctx, wg); err != nil {
				t.Fatal(err)
			}
		}
		g, err := c.Get(ctx, keys, 5000)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Release(ctx, g); err != nil {
			t.Fatalf("scribble %t: release: %v", scribble, err)
		}
		for i, st := range g.Status {
			want := pb.GetStatus_GET_STATUS_HIT
			if scribble && i == 1 {
				want = pb.GetStatus_GET_STATUS_CORRUPT
			}
			if st != want {
				t.Fatalf("scribble %t: key %d: %v, want %v", scribble, i, st, want)
			}
		}
	}
}

// TestClientSums: a client that carries the checksums (Options.ClientSums)
// against a real serve: CopyIn takes the sums, Commit hands them over, a
// verifying Get's CopyOut checks every copy. A page scribbled in the slab
// after its commit is caught by the copy (false, CORRUPT), reported at
// Release and dropped by the door, so the next get reloads the L3 copy
// (written through before the scribble) and verifies. A page written
// without CopyIn commits without sums (the door takes them).
func TestClientSums(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sock, stop, srv := startDoor(t, t.TempDir())
	defer stop()
	c, err := storeclient.Dial(ctx, storeclient.Options{Socket: sock, ClientID: "sums", Namespace: namespace(), ClientSums: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	const pb16 = 16 << 10
	keys := []string{fmt.Sprintf("%064x", 201), fmt.Sprintf("%064x", 202), fmt.Sprintf("%064x", 203)}
	rs, err := c.Set(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for i := range keys[:2] {
		if err := rs.CopyIn(i, page(keys[i], 0, pb16), page(keys[i], 1, pb16)); err != nil {
			t.Fatal(err)
		}
	}
	if err := rs.CopyIn(0, page(keys[0], 0, pb16)); err == nil {
		t.Fatal("CopyIn of one source for two kinds was accepted")
	}
	if _, err := c.Commit(ctx, rs, []bool{true, true, false}); err != nil {
		t.Fatal(err)
	}
	// The third page, written directly into its spans: no sums go.
	rs, err = c.Set(ctx, keys[2:])
	if err != nil {
		t.Fatal(err)
	}
	for k, sp := range rs.Spans[0] {
		copy(sp, page(keys[2], k, pb16))
	}
	if _, err := c.Commit(ctx, rs, []bool{true}); err != nil {
		t.Fatal(err)
	}
	get := func(want ...pb.GetStatus) {
		t.Helper()
		g, err := c.Get(ctx, keys, 5000)
		if err != nil {
			t.Fatal(err)
		}
		for i := range keys {
			if g.Status[i] != pb.GetStatus_GET_STATUS_HIT {
				continue
			}
			dst := [][]byte{make([]byte, pb16), make([]byte, pb16)}
			ok, err := g.CopyOut(i, dst...)
			if err != nil {
				t.Fatal(err)
			}
			if ok && (!bytes.Equal(dst[0], page(keys[i], 0, pb16)) || !bytes.Equal(dst[1], page(keys[i], 1, pb16))) {
				t.Fatalf("key %d: wrong bytes under a matching sum", i)
			}
		}
		if err := c.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		for i, st := range g.Status {
			if st != want[i] {
				t.Fatalf("key %d: %v, want %v", i, st, want[i])
			}
		}
	}
	hit := pb.GetStatus_GET_STATUS_HIT
	get(hit, hit, hit)
	// Written through to l3disk before the scribble (after it, l3disk
	// would gather the scribbled bytes under the client's sum: a miss).
	for srv.StoreDoor().PendingPuts() > 0 {
		time.Sleep(time.Millisecond)
	}
	// Scribble on key 1's page through the client's own mapping.
	g, err := c.Get(ctx, keys[1:2], 5000)
	if err != nil {
		t.Fatal(err)
	}
	g.Spans[0][0][5] ^= 0x21
	if err := c.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	get(hit, pb.GetStatus_GET_STATUS_CORRUPT, hit)
	get(hit, hit, hit) // key 1 reloaded from l3disk, verified
	st, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetCorruptPages() != 1 {
		t.Fatalf("door's corrupt pages %d, want the one the client reported", st.GetCorruptPages())
	}
}

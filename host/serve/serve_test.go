package serve

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/pagehash"
)

// startServer opens a serve on the embedded default stack under dir and
// serves it until the returned stop is called (or the test ends).
func startServer(t testing.TB, dir string, ranks int) (*Server, string, func()) {
	t.Helper()
	return startWith(t, Config{DataDir: dir, Ranks: ranks, SessionTTL: time.Minute})
}

// startWith is startServer with a whole Config (Socket is set here).
func startWith(t testing.TB, cfg Config) (*Server, string, func()) {
	t.Helper()
	// Socket paths are short (sun_path is 108 bytes): under /tmp.
	sd, err := os.MkdirTemp("", "kvs")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(sd, "s.sock")
	ctx, cancel := context.WithCancel(context.Background())
	cfg.Socket = sock
	s, err := Open(ctx, cfg)
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
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not listen within 10 s")
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		os.RemoveAll(sd)
	}
	t.Cleanup(stop)
	return s, sock, stop
}

// drive runs one request to its end: lookup until DONE (verifying the hit
// pages), then store and finish. It returns the DONE result.
func drive(t testing.TB, ctx context.Context, e *testEngine, name string, key []pagehash.Hash) *pb.LookupResult {
	t.Helper()
	return driveGroup(t, ctx, []*testEngine{e}, name, key)[0]
}

// stepAll runs one step on every engine of a group at once (a scheduler
// step of a context-parallel engine) and fails on a call error.
func stepAll(t testing.TB, ctx context.Context, es []*testEngine, q func() *pb.StepRequest, keys map[string][]pagehash.Hash) []*pb.StepReply {
	t.Helper()
	outs := make([]*pb.StepReply, len(es))
	errs := make([]error, len(es))
	var wg sync.WaitGroup
	for i, e := range es {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = e.run(ctx, q(), keys)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
	if es[0].engineGroup {
		// The engine's all-reduce of the ranks' contributions.
		cs := make([][]byte, len(outs))
		for i, out := range outs {
			cs[i] = out.Contribution
		}
		f, err := consensus.ReduceEncoded(cs)
		if err != nil {
			t.Fatalf("engine all-reduce: %v", err)
		}
		for _, e := range es {
			e.frontier = f
		}
	}
	return outs
}

// driveGroup is drive on every rank of a group in lockstep; every rank
// must give the same answer in the same step.
// driveKeys drives keys[i] through the group as request prefix+i, one
// after another, and sums rank 0's hit and L3-hit pages.
func driveKeys(t testing.TB, ctx context.Context, es []*testEngine, prefix string, keys [][]pagehash.Hash) (hit, l3 uint32) {
	t.Helper()
	for i, k := range keys {
		r := driveGroup(t, ctx, es, fmt.Sprintf("%s%d", prefix, i), k)[0]
		hit, l3 = hit+r.HitPages, l3+r.L3Hit
	}
	return hit, l3
}

func driveGroup(t testing.TB, ctx context.Context, es []*testEngine, name string, key []pagehash.Hash) []*pb.LookupResult {
	t.Helper()
	keys := map[string][]pagehash.Hash{name: key}
	res := lookupGroup(t, ctx, es, name, key)
	outs := stepAll(t, ctx, es, func() *pb.StepRequest {
		return &pb.StepRequest{Stores: []*pb.Store{{ReqId: name, Pages: uint32(len(key)), Hashes: packHashes(key)}}, Finished: []*pb.Finish{{ReqId: name}}}
	}, keys)
	for i, out := range outs {
		if len(out.Errors) > 0 {
			t.Fatalf("%s rank %d: store: %v", name, i, out.Errors)
		}
	}
	return res
}

// lookupGroup looks key up as request name on every rank of a group in
// lockstep and steps until it is DONE (verifying the hit pages): a lookup
// that needs the store is PENDING for a step or more, never waited for.
func lookupGroup(t testing.TB, ctx context.Context, es []*testEngine, name string, key []pagehash.Hash) []*pb.LookupResult {
	t.Helper()
	keys := map[string][]pagehash.Hash{name: key}
	outs := stepAll(t, ctx, es, func() *pb.StepRequest {
		return &pb.StepRequest{Lookups: []*pb.Lookup{{ReqId: name, Pages: uint32(len(key)), Hashes: packHashes(key)}}}
	}, keys)
	res := make([]*pb.LookupResult, len(es))
	for n := 0; ; n++ {
		done := 0
		for i, out := range outs {
			if len(out.Errors) > 0 {
				t.Fatalf("%s rank %d: errors %v", name, i, out.Errors)
			}
			for _, r := range out.Lookups {
				if r.ReqId == name && r.Status == pb.LookupStatus_LOOKUP_STATUS_DONE {
					res[i] = r
				}
			}
			if res[i] != nil {
				done++
			}
		}
		if done == len(es) {
			break
		}
		if done > 0 {
			t.Fatalf("%s: %d of %d ranks DONE in the same step: the answer must be replicated", name, done, len(es))
		}
		if n > 400 {
			t.Fatalf("%s: lookup still pending after %d steps", name, n)
		}
		// NB: pace the steps like an engine: a held reload has ReloadTTL
		// ticks (one a step) to land, and back-to-back empty steps on a
		// loaded machine can outrun the L3 (a miss, not a wait).
		time.Sleep(time.Millisecond)
		outs = stepAll(t, ctx, es, func() *pb.StepRequest { return &pb.StepRequest{} }, keys)
	}
	for i, e := range es {
		e.verify(res[i], key)
		if res[i].HitPages != res[0].HitPages {
			t.Fatalf("%s: rank %d hit %d pages, rank 0 %d", name, i, res[i].HitPages, res[0].HitPages)
		}
	}
	return res
}

func TestServeHitsAndVerifiedBytes(t *testing.T) {
	ctx := context.Background()
	_, sock, _ := startServer(t, t.TempDir(), 1)
	e := dialEngine(t, sock, 0, 1)
	if err := e.register(ctx); err != nil {
		t.Fatal(err)
	}
	var hits, l1 uint32
	for i := range 20 {
		key := chain("system-prompt", 6, 10, reqName(i))
		res := drive(t, ctx, e, reqName(i), key)
		if i == 0 && res.HitPages != 0 {
			t.Fatalf("first request hit %d pages of an empty cache", res.HitPages)
		}
		hits += res.HitPages
		l1 += res.L1Hit
	}
	// Settle the last backups.
	if _, err := e.run(ctx, &pb.StepRequest{}, nil); err != nil {
		t.Fatal(err)
	}
	if hits < 19*6 || l1 == 0 {
		t.Fatalf("hits %d (l1 %d), want at least %d: the shared prefix of 6 pages", hits, l1, 19*6)
	}
	if e.wrong != 0 || e.verified < 19*6 {
		t.Fatalf("verified %d pages, %d wrong", e.verified, e.wrong)
	}
}

// TestServeContributionWireEncoding: with serve's own group transport a
// Step reply carries the rank's contribution to its next tick in the wire
// encoding the engine transport uses (zero group and stack ids), never a
// second format.
func TestServeContributionWireEncoding(t *testing.T) {
	ctx := context.Background()
	_, sock, _ := startServer(t, t.TempDir(), 1)
	e := dialEngine(t, sock, 0, 1)
	if err := e.register(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		drive(t, ctx, e, reqName(i), chain("prefix", 2, 2, reqName(i)))
		out, err := e.run(ctx, &pb.StepRequest{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		env, c, err := consensus.DecodeContribution(out.Contribution, consensus.Expect{Size: 1})
		if err != nil {
			t.Fatalf("step reply's contribution %x: %v", out.Contribution, err)
		}
		if env.Rank != 0 || c.Tick != out.Tick {
			t.Fatalf("contribution of rank %d for tick %d, want rank 0, tick %d", env.Rank, c.Tick, out.Tick)
		}
	}
}

// TestServeRestartFindsL3 stops serve, opens it again on the same data dir
// and finds the pages of the first run in L3, verified byte for byte.
func TestServeRestartFindsL3(t *testing.T) {
	ctx := context.Background()
	_, e, keys := restartWithL3(t, ctx)
	var l3 uint32
	for i := range keys {
		res := drive(t, ctx, e, "again"+reqName(i), keys[i])
		l3 += res.L3Hit
	}
	if l3 == 0 || e.wrong != 0 {
		t.Fatalf("after the restart: %d L3 hit pages, %d wrong pages (verified %d)", l3, e.wrong, e.verified)
	}
}

// restartWithL3 stores 8 keys of 12 pages through a serve, lets the spills
// land, stops it and starts a new serve on the same data dir: the pages
// are then only in L3. It returns the new serve, a registered engine on
// it and the keys.
func restartWithL3(t *testing.T, ctx context.Context) (*Server, *testEngine, [][]pagehash.Hash) {
	t.Helper()
	dir := t.TempDir()
	_, sock, stop := startServer(t, dir, 1)
	e := dialEngine(t, sock, 0, 1)
	if err := e.register(ctx); err != nil {
		t.Fatal(err)
	}
	keys := make([][]pagehash.Hash, 8)
	for i := range keys {
		keys[i] = chain(reqName(i), 12, 12, "")
		drive(t, ctx, e, reqName(i), keys[i])
	}
	for range 20 { // let the spills land
		if _, err := e.run(ctx, &pb.StepRequest{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	e.close()
	srv, sock, _ := startServer(t, dir, 1)
	e = dialEngine(t, sock, 0, 1)
	if err := e.register(ctx); err != nil {
		t.Fatal(err)
	}
	return srv, e, keys
}

// TestServeBadInput: every malformed item is refused on its own, named,
// and changes nothing; the step's good items go on.
func TestServeBadInput(t *testing.T) {
	ctx := context.Background()
	_, sock, _ := startServer(t, t.TempDir(), 1)
	e := dialEngine(t, sock, 0, 1)
	if err := e.register(ctx); err != nil {
		t.Fatal(err)
	}
	good := chain("good", 4, 4, "")
	drive(t, ctx, e, "live", good) // finished: "live" is no longer live
	e.run(ctx, &pb.StepRequest{Lookups: []*pb.Lookup{{ReqId: "held", Pages: 4, Hashes: packHashes(good)}}}, nil)
	h := packHashes(good)
	for _, tc := range []struct {
		name string
		q    *pb.StepRequest
		raw  bool // session, boot_id and step as given
		item string
		code pb.ErrorCode
	}{
		{"unknown session", &pb.StepRequest{Session: "nope", BootId: e.reg.BootId, Step: 1 << 40}, true, "session", pb.ErrorCode_ERROR_CODE_UNKNOWN},
		{"stale boot_id", &pb.StepRequest{Session: e.reg.Session, BootId: "old", Step: 1 << 40}, true, "boot_id", pb.ErrorCode_ERROR_CODE_STATE},
		{"step goes back", &pb.StepRequest{Session: e.reg.Session, BootId: e.reg.BootId, Step: 1}, true, "step", pb.ErrorCode_ERROR_CODE_STATE},
		{"hash count", &pb.StepRequest{Lookups: []*pb.Lookup{{ReqId: "a", Pages: 5, Hashes: h}}}, false, "lookups[0]", pb.ErrorCode_ERROR_CODE_INVALID},
		{"no pages", &pb.StepRequest{Lookups: []*pb.Lookup{{ReqId: "a"}}}, false, "lookups[0]", pb.ErrorCode_ERROR_CODE_INVALID},
		{"empty id", &pb.StepRequest{Lookups: []*pb.Lookup{{Pages: 4, Hashes: h}}}, false, "lookups[0]", pb.ErrorCode_ERROR_CODE_INVALID},
		{"duplicate in step", &pb.StepRequest{Lookups: []*pb.Lookup{{ReqId: "d", Pages: 4, Hashes: h}, {ReqId: "d", Pages: 4, Hashes: h}}}, false, "lookups[1]", pb.ErrorCode_ERROR_CODE_DUPLICATE},
		{"already live", &pb.StepRequest{Lookups: []*pb.Lookup{{ReqId: "held", Pages: 4, Hashes: h}}}, false, "lookups[0]", pb.ErrorCode_ERROR_CODE_DUPLICATE},
		{"completion never planned", &pb.StepRequest{Completions: []*pb.Completion{{Plan: 1 << 50, Ok: true}}}, false, "completions[0]", pb.ErrorCode_ERROR_CODE_UNKNOWN},
		{"store before lookup", &pb.StepRequest{Stores: []*pb.Store{{ReqId: "never", Pages: 4, Hashes: h}}}, false, "stores[0]", pb.ErrorCode_ERROR_CODE_UNKNOWN},
		{"finish unknown", &pb.StepRequest{Finished: []*pb.Finish{{ReqId: "live"}}}, false, "finished[0]", pb.ErrorCode_ERROR_CODE_UNKNOWN},
		{"abort twice", &pb.StepRequest{Aborted: []*pb.Abort{{ReqId: "held"}, {ReqId: "held"}}}, false, "aborted[1]", pb.ErrorCode_ERROR_CODE_DUPLICATE},
		{"too many pages", &pb.StepRequest{Lookups: []*pb.Lookup{{ReqId: "big", Pages: 1 << 20, Hashes: nil}}}, false, "lookups[0]", pb.ErrorCode_ERROR_CODE_LIMIT},
		{"engine frontier", &pb.StepRequest{Frontier: []byte{1}}, false, "frontier", pb.ErrorCode_ERROR_CODE_INVALID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out *pb.StepReply
			var err error
			if tc.raw {
				out, err = e.cl.Step(ctx, tc.q)
			} else {
				out, err = e.run(ctx, tc.q, nil)
			}
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, ie := range out.Errors {
				if ie.Item == tc.item && ie.Code == tc.code && ie.Message != "" {
					found = true
				}
			}
			if !found {
				t.Fatalf("want an error on %s with code %s, got %v", tc.item, tc.code, out.Errors)
			}
			if out.BootId != e.reg.BootId {
				t.Fatalf("reply boot_id %q, want %q", out.BootId, e.reg.BootId)
			}
		})
	}
	// The engine is still in a good state after all of it.
	res := drive(t, ctx, e, "after", good)
	if res.HitPages != 4 || e.wrong != 0 {
		t.Fatalf("after the bad input: hit %d pages (want 4), %d wrong", res.HitPages, e.wrong)
	}
}

func TestServeRegisterRefusals(t *testing.T) {
	ctx := context.Background()
	_, sock, _ := startServer(t, t.TempDir(), 2)
	e := dialEngine(t, sock, 0, 2)
	for _, tc := range []struct {
		name  string
		edit  func(q *pb.RegisterRequest)
		field string
	}{
		{"world size", func(q *pb.RegisterRequest) { q.WorldSize = 3 }, "world_size"},
		{"rank", func(q *pb.RegisterRequest) { q.Rank = 2 }, "rank"},
		{"page tokens", func(q *pb.RegisterRequest) { q.Namespace.PageTokens = 16 }, "namespace.page_tokens"},
		{"page bytes", func(q *pb.RegisterRequest) { q.Namespace.PageBytes = []uint64{4096} }, "namespace.page_bytes[0]"},
		{"kinds", func(q *pb.RegisterRequest) { q.Namespace.PageBytes = nil }, "namespace.page_bytes"},
		{"no model", func(q *pb.RegisterRequest) { q.Namespace.Model = "" }, "namespace.model"},
		{"no namespace", func(q *pb.RegisterRequest) { q.Namespace = nil }, "namespace"},
		{"protocol", func(q *pb.RegisterRequest) { q.ProtocolVersions = []uint32{2} }, "protocol_versions"},
		{"no protocol", func(q *pb.RegisterRequest) { q.ProtocolVersions = nil }, "protocol_versions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := &pb.RegisterRequest{EngineId: "t", Rank: 0, WorldSize: 2, ProtocolVersions: []uint32{1},
				Namespace: &pb.Namespace{Model: "m", PageTokens: 512, PageBytes: []uint64{16 << 10}}}
			tc.edit(q)
			_, err := e.cl.Register(ctx, q)
			st, _ := status.FromError(err)
			if err == nil || st.Code() == codes.OK || !contains(st.Message(), tc.field) {
				t.Fatalf("want a refusal naming %s, got %v", tc.field, err)
			}
		})
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && (s[:len(sub)] == sub || contains(s[1:], sub)))
}

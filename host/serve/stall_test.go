package serve

import (
	"context"
	"testing"
	"time"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/host/stack"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// TestServeStepNeverWaitsOnL3: serve restarts over an L3 that holds the
// first run's pages, its store behind a gate (tiertest.GatedStore, a fault
// injection fake) that makes every call wait until the test opens it.
// While it is closed, steps keep returning and ticking, and a lookup whose
// pages are only in L3 stays PENDING; opening the gate completes it: DONE
// with L3 hits, every byte verified.
func TestServeStepNeverWaitsOnL3(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	_, sock, stop := startServer(t, dir, 1)
	e := dialEngine(t, sock, 0, 1)
	if err := e.register(ctx); err != nil {
		t.Fatal(err)
	}
	keys := make([][]pagehash.Hash, 4)
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

	var g *tiertest.GatedStore
	gate := func(_ context.Context, _ int, s *stack.Stack) (func() error, error) {
		g = tiertest.NewGatedStore(s.Stores[0].Store)
		s.Stores[0].Store = g
		return nil, nil
	}
	_, sock, _ = startWith(t, Config{DataDir: dir, SessionTTL: time.Minute, Stores: gate})
	e = dialEngine(t, sock, 0, 1)
	if err := e.register(ctx); err != nil {
		t.Fatal(err)
	}
	g.Block()
	key := keys[0]
	out, err := e.run(ctx, &pb.StepRequest{Lookups: []*pb.Lookup{{ReqId: "cold", Pages: uint32(len(key)), Hashes: packHashes(key)}}}, nil)
	if err != nil || len(out.Errors) > 0 {
		t.Fatal(err, out.GetErrors())
	}
	if len(out.Lookups) != 1 || out.Lookups[0].Status != pb.LookupStatus_LOOKUP_STATUS_PENDING {
		t.Fatalf("lookup over a blocked L3: %v, want PENDING", out.Lookups)
	}
	for deadline := time.Now().Add(10 * time.Second); g.Waiting() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the lookup never reached the store")
		}
	}
	tick := out.Tick
	for i := range 10 {
		out, err := e.run(ctx, &pb.StepRequest{}, nil)
		if err != nil || len(out.Errors) > 0 {
			t.Fatal(err, out.GetErrors())
		}
		if len(out.Lookups) > 0 {
			t.Fatalf("step %d with L3 blocked answered %v", i, out.Lookups)
		}
		if out.Tick <= tick {
			t.Fatalf("step %d did not tick: tick %d after %d", i, out.Tick, tick)
		}
		tick = out.Tick
	}
	if g.Waiting() == 0 {
		t.Fatal("nothing waits at the gate: the lookup did not need L3")
	}
	g.Release()
	var res *pb.LookupResult
	for i := 0; res == nil; i++ {
		// NB: an engine's step is 10-50 ms; back-to-back steps of an
		// idle test are 0.1 ms, and serve's ReloadTTL (64 ticks) would
		// end the hold before a 5 ms Get lands. Pace them like a
		// (fast) engine.
		time.Sleep(5 * time.Millisecond)
		if i > 200 {
			t.Fatal("lookup still PENDING 200 steps after L3 opened")
		}
		out, err := e.run(ctx, &pb.StepRequest{}, map[string][]pagehash.Hash{"cold": key})
		if err != nil || len(out.Errors) > 0 {
			t.Fatal(err, out.GetErrors())
		}
		for _, r := range out.Lookups {
			if r.ReqId == "cold" && r.Status == pb.LookupStatus_LOOKUP_STATUS_DONE {
				res = r
			}
		}
	}
	e.verify(res, key)
	if res.HitPages != uint32(len(key)) || res.L3Hit == 0 || e.wrong != 0 || e.verified < len(key) {
		t.Fatalf("after L3 opened: %v, verified %d, wrong %d", res, e.verified, e.wrong)
	}
}

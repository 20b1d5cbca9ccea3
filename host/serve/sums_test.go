package serve

import (
	"context"
	"strings"
	"testing"
	"time"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/pagehash"
)

// stepOwed sends one step whose completions are comps (the engine's owed
// ones are not sent) and runs the reply.
func stepOwed(t *testing.T, ctx context.Context, e *testEngine, q *pb.StepRequest, comps []*pb.Completion, keys map[string][]pagehash.Hash) *pb.StepReply {
	t.Helper()
	e.done = nil
	q.Completions = comps
	out, err := e.run(ctx, q, keys)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// takeOwed returns the completions the engine owes and forgets them.
func takeOwed(e *testEngine) []*pb.Completion {
	c := e.done
	e.done = nil
	return c
}

// wantSumsErr checks a reply refused exactly completions[0].sums as
// INVALID with a message containing sub.
func wantSumsErr(t *testing.T, out *pb.StepReply, sub string) {
	t.Helper()
	if len(out.Errors) != 1 {
		t.Fatalf("errors %v, want one for completions[0].sums", out.Errors)
	}
	e := out.Errors[0]
	if e.Item != "completions[0].sums" || e.Code != pb.ErrorCode_ERROR_CODE_INVALID || !strings.Contains(e.Message, sub) {
		t.Fatalf("error %v, want INVALID completions[0].sums containing %q", e, sub)
	}
}

// TestServeCompletionSums: a completion's sums are none or one per item of
// a TO_SLAB plan; anything else is refused by name (completions[i].sums),
// INVALID, and the plan stays outstanding for a correct report.
func TestServeCompletionSums(t *testing.T) {
	ctx := context.Background()
	_, sock, _ := startServer(t, t.TempDir(), 1)
	e := dialEngine(t, sock, 0, 1)
	if err := e.register(ctx); err != nil {
		t.Fatal(err)
	}
	e.sums = true
	// store puts key's pages in L1 and returns the TO_SLAB plan's owed
	// completion, with its sums.
	store := func(name string, key []pagehash.Hash) *pb.Completion {
		t.Helper()
		keys := map[string][]pagehash.Hash{name: key}
		lookupGroup(t, ctx, []*testEngine{e}, name, key)
		out := stepOwed(t, ctx, e, &pb.StepRequest{Stores: []*pb.Store{{ReqId: name, Pages: uint32(len(key)), Hashes: packHashes(key)}}, Finished: []*pb.Finish{{ReqId: name}}}, nil, keys)
		owed := takeOwed(e)
		if len(out.Errors) > 0 || len(out.Plans) != 1 || out.Plans[0].Direction != pb.Direction_DIRECTION_TO_SLAB || len(owed) != 1 {
			t.Fatalf("store %s: errors %v, plans %v, owed %v: want one TO_SLAB plan", name, out.Errors, out.Plans, owed)
		}
		if got, want := len(owed[0].Sums), len(out.Plans[0].Items); got != want {
			t.Fatalf("store %s: the engine computed %d sums for %d items", name, got, want)
		}
		return owed[0]
	}
	c := store("a", chain("a", 4, 4, ""))
	n := len(c.Sums)
	cases := []struct {
		name string
		sums []uint32
		// wantErr is part of the refusal's message; "" accepts.
		wantErr string
	}{
		{name: "one short", sums: c.Sums[:n-1], wantErr: "sums for its"},
		{name: "one too many", sums: append(append([]uint32(nil), c.Sums...), 7), wantErr: "sums for its"},
		{name: "one per item", sums: c.Sums},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := stepOwed(t, ctx, e, &pb.StepRequest{}, []*pb.Completion{{Plan: c.Plan, Ok: true, Sums: tc.sums}}, nil)
			if tc.wantErr == "" {
				if len(out.Errors) > 0 {
					t.Fatalf("errors %v, want none", out.Errors)
				}
				return
			}
			wantSumsErr(t, out, tc.wantErr)
		})
	}
	// A completion without sums (today's engines) is accepted, and a
	// failed plan's sums are checked, then ignored.
	for _, tc := range []struct {
		name string
		fix  func(c *pb.Completion)
	}{
		{name: "no sums", fix: func(c *pb.Completion) { c.Sums = nil }},
		{name: "failed with sums", fix: func(c *pb.Completion) { c.Ok = false }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := store("b-"+tc.name, chain("b-"+tc.name, 4, 4, ""))
			tc.fix(c)
			if out := stepOwed(t, ctx, e, &pb.StepRequest{}, []*pb.Completion{c}, nil); len(out.Errors) > 0 {
				t.Fatalf("errors %v, want none", out.Errors)
			}
		})
	}

	// A FROM_SLAB plan (a load-back after a reload from L3) takes no sums.
	t.Run("sums on a FROM_SLAB plan", func(t *testing.T) {
		_, e, keys := restartWithL3(t, ctx)
		name, key := "load", keys[0]
		km := map[string][]pagehash.Hash{name: key}
		out := stepOwed(t, ctx, e, &pb.StepRequest{Lookups: []*pb.Lookup{{ReqId: name, Pages: uint32(len(key)), Hashes: packHashes(key)}}}, nil, km)
		var load *pb.CopyPlan
		for range 400 {
			for _, pl := range out.Plans {
				if pl.Direction == pb.Direction_DIRECTION_FROM_SLAB {
					load = pl
				}
			}
			if load != nil {
				break
			}
			time.Sleep(time.Millisecond)
			out = stepOwed(t, ctx, e, &pb.StepRequest{}, takeOwed(e), km)
		}
		if load == nil {
			t.Fatal("no FROM_SLAB plan after 400 steps")
		}
		// The load's completion alone, with sums; the other owed ones
		// wait for the next step.
		var loadDone *pb.Completion
		var rest []*pb.Completion
		for _, c := range takeOwed(e) {
			if c.Plan == load.Plan {
				loadDone = c
			} else {
				rest = append(rest, c)
			}
		}
		if loadDone == nil || len(loadDone.Sums) != 0 {
			t.Fatalf("the engine owes %v for the load, want a completion without sums", loadDone)
		}
		bad := &pb.Completion{Plan: loadDone.Plan, Ok: loadDone.Ok, Sums: make([]uint32, len(load.Items))}
		out = stepOwed(t, ctx, e, &pb.StepRequest{}, []*pb.Completion{bad}, km)
		wantSumsErr(t, out, "FROM_SLAB")
		// Reported again without sums, the load lands and the lookup is
		// DONE with the pages verified.
		comps := append(append([]*pb.Completion{loadDone}, rest...), takeOwed(e)...)
		var done *pb.LookupResult
		for range 400 {
			out = stepOwed(t, ctx, e, &pb.StepRequest{}, comps, km)
			if len(out.Errors) > 0 {
				t.Fatalf("errors %v", out.Errors)
			}
			for _, r := range out.Lookups {
				if r.ReqId == name && r.Status == pb.LookupStatus_LOOKUP_STATUS_DONE {
					done = r
				}
			}
			if done != nil {
				break
			}
			time.Sleep(time.Millisecond)
			comps = takeOwed(e)
		}
		if done == nil {
			t.Fatal("lookup not DONE after the load was reported")
		}
		e.verify(done, key)
		if done.HitPages != uint32(len(key)) || e.wrong != 0 {
			t.Fatalf("hit %d of %d pages after the reload, %d wrong", done.HitPages, len(key), e.wrong)
		}
	})
}

// TestServeEngineSumsCatchScribble is the laundering test of the engine
// path: the engine writes a key's pages into the slab and reports their
// sums; something then changes the pages in the slab before the spill
// gathers them. With the sums the L3 keeps the engine's sums over the
// changed bytes, so after a restart (the pages only in L3) the key is a
// miss: never wrong bytes, never a valid-looking slot. Unchanged, it is
// an L3 hit. Without sums the store computes its own over the changed
// bytes and vouches for them: the control case, where the wrong bytes
// come back as a hit.
func TestServeEngineSumsCatchScribble(t *testing.T) {
	cases := []struct {
		name            string
		sums, scribble  bool
		wantHit         bool
		wantWrongOnHits bool
	}{
		{name: "sums, unchanged", sums: true, wantHit: true},
		{name: "sums, scribbled before the spill", sums: true, scribble: true, wantHit: false},
		{name: "no sums, scribbled (the store vouches for it)", scribble: true, wantHit: true, wantWrongOnHits: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			_, sock, stop := startServer(t, dir, 1)
			e := dialEngine(t, sock, 0, 1)
			if err := e.register(ctx); err != nil {
				t.Fatal(err)
			}
			e.sums = c.sums
			key := chain("victim", 6, 6, "")
			if c.scribble {
				e.scribble = func(sp []byte) { sp[len(sp)/3] ^= 0x10 }
			}
			drive(t, ctx, e, "victim", key)
			e.scribble = nil
			other := chain("other", 6, 6, "")
			drive(t, ctx, e, "other", other)
			for range 20 { // let the spills land
				if _, err := e.run(ctx, &pb.StepRequest{}, nil); err != nil {
					t.Fatal(err)
				}
			}
			stop()
			e.close()

			_, sock, _ = startServer(t, dir, 1)
			e = dialEngine(t, sock, 0, 1)
			if err := e.register(ctx); err != nil {
				t.Fatal(err)
			}
			res := drive(t, ctx, e, "again", key)
			wantHit := uint32(0)
			if c.wantHit {
				wantHit = uint32(len(key))
			}
			if res.HitPages != wantHit || res.L3Hit != wantHit {
				t.Fatalf("after the restart: hit %d pages (%d from L3), want %d", res.HitPages, res.L3Hit, wantHit)
			}
			if wrong := e.wrong > 0; wrong != c.wantWrongOnHits {
				t.Fatalf("after the restart: %d wrong pages, %d verified; want wrong bytes: %t", e.wrong, e.verified, c.wantWrongOnHits)
			}
			// The key written after the scribble is untouched: a hit.
			e.wrong, e.verified = 0, 0
			if res := drive(t, ctx, e, "again-other", other); res.L3Hit != uint32(len(other)) || e.wrong != 0 {
				t.Fatalf("the untouched key: %d L3 hit pages of %d, %d wrong", res.L3Hit, len(other), e.wrong)
			}
		})
	}
}

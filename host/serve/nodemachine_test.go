package serve

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/loadgen"
	"github.com/kvtier/kvtier/workload"
)

// TestOneMachineMatchesMachinePerRank is metamorphic: one workload
// through a serve of 3 ranks with one Machine for the node and through
// one with a Machine a rank (exchanging in process) gives every rank the
// same lookup answers (hit pages by tier) and verified bytes, with owner
// lanes and without.
func TestOneMachineMatchesMachinePerRank(t *testing.T) {
	for _, lanes := range []bool{false, true} {
		var got [2][]string
		for k, perRank := range []bool{false, true} {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			s, sock, stop := startWith(t, Config{DataDir: t.TempDir(), Ranks: 3, MachinePerRank: perRank, OwnerLanes: lanes})
			if s.oneMachine() == perRank {
				t.Fatalf("MachinePerRank %v: oneMachine %v", perRank, s.oneMachine())
			}
			es := make([]*testEngine, 3)
			for r := range es {
				es[r] = dialEngine(t, sock, uint32(r), 3)
				if err := es[r].register(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 24 {
				key := chain("sys", 4, 6+i%5, fmt.Sprintf("c%d", i%9))
				res := driveGroup(t, ctx, es, fmt.Sprintf("r%d", i), key)
				got[k] = append(got[k], fmt.Sprintf("%d/%d/%d/%d", res[0].HitPages, res[0].L1Hit, res[0].L2Hit, res[0].L3Hit))
			}
			// Every rank offers the same digest at the same tick, and its
			// own contribution: the engine's reduce of them works.
			if digests := equalDigests(t, ctx, es); digests == 0 {
				t.Fatalf("per rank %v: no digest tick in 70 steps", perRank)
			}
			outs := stepAll(t, ctx, es, func() *pb.StepRequest { return &pb.StepRequest{} }, nil)
			cs := make([][]byte, len(outs))
			for r, out := range outs {
				cs[r] = out.Contribution
			}
			if _, err := consensus.ReduceEncoded(cs); err != nil {
				t.Fatalf("per rank %v: the ranks' contributions do not reduce: %v", perRank, err)
			}
			for r, e := range es {
				if e.wrong != 0 || e.verified == 0 {
					t.Fatalf("lanes %v, per rank %v: rank %d verified %d pages, %d wrong bytes", lanes, perRank, r, e.verified, e.wrong)
				}
				e.close()
			}
			stop()
			cancel()
		}
		if strings.Join(got[0], " ") != strings.Join(got[1], " ") {
			t.Fatalf("lanes %v: one Machine answered\n%v\na Machine a rank\n%v", lanes, got[0], got[1])
		}
	}
}

// TestOneMachineRanksDiffer: ranks whose engines send different steps
// stop the group (every rank's reply says so; nothing of the step is
// answered), and the next engine's ranks step cleanly.
func TestOneMachineRanksDiffer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, sock, _ := startWith(t, Config{DataDir: t.TempDir(), Ranks: 3})
	es := openGroup(t, ctx, s, sock, 3)
	driveGroup(t, ctx, es, "warm", chain("p", 4, 6, "w"))
	// Report the store's plans, so its pages reach L2 and L3.
	for range 3 {
		stepAll(t, ctx, es, func() *pb.StepRequest { return &pb.StepRequest{} }, nil)
	}
	k0, k2 := chain("p", 4, 6, "a"), chain("p", 4, 6, "b")
	for _, e := range es {
		e.close()
	}
	for _, bad := range []func(r int) *pb.StepRequest{
		// Rank 2 looks up another key.
		func(r int) *pb.StepRequest {
			k := k0
			if r == 2 {
				k = k2
			}
			return &pb.StepRequest{Lookups: []*pb.Lookup{{ReqId: "x", Pages: uint32(len(k)), Hashes: packHashes(k)}}}
		},
		// Rank 1 finishes a request the others keep.
		func(r int) *pb.StepRequest {
			if r == 1 {
				return &pb.StepRequest{Aborted: []*pb.Abort{{ReqId: "y"}}}
			}
			return &pb.StepRequest{}
		},
	} {
		es = openGroup(t, ctx, s, sock, 3)
		ky := chain("p", 4, 6, "y")
		lookupGroup(t, ctx, es, "y", ky)
		outs := make([]*pb.StepReply, 3)
		done := make(chan int, 3)
		for r := range es {
			go func() {
				var err error
				outs[r], err = es[r].run(ctx, bad(r), nil)
				if err != nil {
					t.Error(err)
				}
				done <- r
			}()
		}
		for range es {
			<-done
		}
		for r, out := range outs {
			msg := fmt.Sprint(out.GetErrors())
			if !strings.Contains(msg, "different steps") || !strings.Contains(msg, "UNAVAILABLE") || len(out.GetLookups()) != 0 || len(out.GetPlans()) != 0 {
				t.Fatalf("rank %d: errors %s, %d lookups, %d plans; want only the group stopped for differing steps", r, msg, len(out.GetLookups()), len(out.GetPlans()))
			}
		}
		for _, e := range es {
			e.close()
		}
		// The next engine's ranks step cleanly and hit what was stored.
		es = openGroup(t, ctx, s, sock, 3)
		res := driveGroup(t, ctx, es, "again", chain("p", 4, 6, "w"))
		if res[0].HitPages == 0 {
			t.Fatalf("after the stop: no hit on the warm key")
		}
		for _, e := range es {
			e.close()
		}
	}
	if n := s.ranks[0].stats.mismatches.Load(); n < 2 {
		t.Fatalf("mismatches counted %d, want 2", n)
	}
}

// TestOneMachineLoadgen drives a generated workload through serve's one
// Machine with loadgen's engine ranks, many lookups, stores and ends a
// step (lookups PENDING before a step's tick and DONE after it, reloads,
// evictions): every rank gets rank 0's answers, so every engine rank
// steps alike. No step errs (a rank answered otherwise would send
// another step and stop the group), no byte is wrong, and pages hit.
func TestOneMachineLoadgen(t *testing.T) {
	noL3 := DefaultYAML()
	i, j := strings.Index(noL3, "  - name: l3\n"), strings.Index(noL3, "policy:")
	if i < 0 || j < i {
		t.Fatal("the embedded stack has no l3 entry")
	}
	noL3 = noL3[:i] + noL3[j:]
	for _, c := range []struct {
		ranks    int
		lanes    bool
		yaml     string
		requests int
		cfg      loadgen.Config
	}{
		{3, false, "", 500, loadgen.Config{PerStep: 12, MaxLive: 24, MaxPages: 32}},
		{4, true, "", 1500, loadgen.Config{PerStep: 16, MaxLive: 32, MaxPages: 48}},
		// kvtier bench serve --cpu-sessions 1,8's shape (16,000 requests
		// of it once stopped the first build's group).
		{8, false, noL3, 8000, loadgen.Config{PerStep: 32, MaxLive: 64, MaxPages: 64, NoPayload: true, NoCopies: true}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		_, sock, stop := startWith(t, Config{DataDir: t.TempDir(), Ranks: c.ranks, OwnerLanes: c.lanes, YAML: c.yaml})
		g := workload.DefaultGeneratorConfig()
		g.Requests, g.Seed = c.requests, uint64(c.ranks)
		reqs, err := workload.Generate(g)
		if err != nil {
			t.Fatal(err)
		}
		lc := c.cfg
		lc.Socket, lc.Ranks, lc.Requests = sock, c.ranks, reqs
		res, err := loadgen.Run(ctx, lc)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d ranks, lanes %v: %d requests, hit rate %.3f by tier %v, verified %d pages", c.ranks, c.lanes, res.Requests, res.HitRate, res.HitTokensByTier, res.VerifiedPages)
		if res.Errors != 0 || res.WrongBytes != 0 || res.HitRate == 0 || (!lc.NoPayload && res.VerifiedPages == 0) {
			t.Fatalf("%d ranks, lanes %v: %d errors (%s), %d wrong bytes, %d verified pages, hit rate %v", c.ranks, c.lanes, res.Errors, res.FirstError, res.WrongBytes, res.VerifiedPages, res.HitRate)
		}
		stop()
		cancel()
	}
}

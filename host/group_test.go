package host

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/host/consensus/inproc"
	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/pagehash"
)

// TestConsensusGroupMatchesReduce: ranks with identical events and random
// local completions exchange through ConsensusGroup over the in-process
// transport; every frontier equals control.Reduce of the same
// contributions, every rank applies it, and the digests stay equal.
func TestConsensusGroupMatchesReduce(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			const ranks = 3
			ms := make([]*control.Machine, ranks)
			for r := range ms {
				o := control.DefaultOptions()
				o.DigestEvery = 4
				m, err := control.New(o)
				if err != nil {
					t.Fatal(err)
				}
				ms[r] = m
			}
			members, err := inproc.New(ranks, inproc.DefaultOptions())
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(seed, 0))
			type pend struct {
				op    control.OpID
				stage control.Stage
			}
			pending := make([][]pend, ranks)
			for step := range 60 {
				// One replicated event on every rank.
				var key []pagehash.Hash
				for p := range 1 + rng.IntN(4) {
					key = append(key, control.PageHash(fmt.Sprintf("s%d-%d-%d", seed, step%7, p)))
				}
				ev := control.Event{Kind: control.EvInsert, Req: control.ReqID(step + 1), Pages: len(key), Hashes: key}
				for r, m := range ms {
					if err := m.Apply(ev); err != nil {
						t.Fatalf("seed %d rank %d: %v", seed, r, err)
					}
					if err := m.Apply(control.Event{Kind: control.EvRelease, Req: ev.Req}); err != nil {
						t.Fatal(err)
					}
					rd := m.Ready()
					m.Advance()
					for _, c := range rd.Copies {
						pending[r] = append(pending[r], pend{c.Op, control.StageCopied})
					}
					for _, p := range rd.Puts {
						pending[r] = append(pending[r], pend{p.Op, control.StageGathered}, pend{p.Op, control.StageDurable})
					}
				}
				// Each rank finishes a random prefix of its pending ops.
				for r, m := range ms {
					n := rng.IntN(len(pending[r]) + 1)
					for _, p := range pending[r][:n] {
						if err := m.Done(p.op, p.stage, rng.IntN(10) > 0); err != nil && !errors.Is(err, control.ErrUnknownOp) {
							t.Fatalf("done: %v", err)
						}
					}
					pending[r] = pending[r][n:]
				}
				cs := make([]control.Contribution, ranks)
				for r, m := range ms {
					cs[r] = m.Contribution()
				}
				want, err := control.Reduce(cs...)
				if err != nil {
					t.Fatal(err)
				}
				got := make([]control.Frontier, ranks)
				var wg sync.WaitGroup
				errs := make([]error, ranks)
				for r := range ranks {
					wg.Add(1)
					go func() {
						defer wg.Done()
						g := ConsensusGroup{G: members[r], M: ms[r], DigestEvery: 4}
						got[r], errs[r] = g.Exchange(context.Background(), ms[r].Ticks(), cs[r])
					}()
				}
				wg.Wait()
				for r := range ranks {
					if errs[r] != nil {
						t.Fatalf("seed %d step %d rank %d: %v", seed, step, r, errs[r])
					}
					if got[r].String() != want.String() || got[r].TierUp != want.TierUp {
						t.Fatalf("seed %d step %d rank %d: frontier %s, Reduce gives %s", seed, step, r, got[r], want)
					}
					if err := ms[r].Tick(got[r]); err != nil {
						t.Fatalf("seed %d step %d rank %d: tick: %v", seed, step, r, err)
					}
					ms[r].Advance()
				}
				if ms[0].Digest() != ms[ranks-1].Digest() {
					t.Fatalf("seed %d step %d: digests differ", seed, step)
				}
			}
		})
	}
}

// TestConsensusGroupCatchesDivergence: one rank applies an event the
// others do not; the next digest exchange fails on every rank with an
// error that names the tick and the first differing structure (the tree).
func TestConsensusGroupCatchesDivergence(t *testing.T) {
	const ranks = 2
	ms := make([]*control.Machine, ranks)
	for r := range ms {
		o := control.DefaultOptions()
		o.L3, o.WritePolicy = false, control.WriteBack // the insert issues no op
		m, err := control.New(o)
		if err != nil {
			t.Fatal(err)
		}
		ms[r] = m
	}
	members, err := inproc.New(ranks, inproc.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	key := []pagehash.Hash{control.PageHash("only-rank-1")}
	if err := ms[1].Apply(control.Event{Kind: control.EvInsert, Req: 1, Pages: 1, Hashes: key}); err != nil {
		t.Fatal(err)
	}
	ms[1].Advance()
	errs := make([]error, ranks)
	var wg sync.WaitGroup
	for r := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := ConsensusGroup{G: members[r], M: ms[r], DigestEvery: 1}
			_, errs[r] = g.Exchange(context.Background(), 0, ms[r].Contribution())
		}()
	}
	wg.Wait()
	for r, err := range errs {
		var mm *consensus.MismatchError
		if !errors.As(err, &mm) || !strings.Contains(err.Error(), "tree") {
			t.Fatalf("rank %d: %v, want a digest mismatch naming the tree", r, err)
		}
		t.Logf("rank %d: %v", r, err)
	}
}

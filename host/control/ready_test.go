package control

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvtier/kvtier/pagehash"
)

// TestOutputLivesUntilTheNextAdvance drives a small Machine through steps
// of matches, inserts, finishes, releases and ticks, every op done at once,
// and checks that each Ready, snapshotted when Advance handed it out, is
// unchanged — its slices and the ranges and spans inside them — through
// the next step's events and tick, up to the next Advance, and that its
// matches, placements, holds, unholds and skips stay unchanged after that
// too: the reused arrays never hold work a driver may still be carrying
// out, and a driver may walk a Ready's unholds while it applies more
// events (serve does).
func TestOutputLivesUntilTheNextAdvance(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		rng := rand.New(rand.NewPCG(seed, 11))
		m := testMachine(t)
		docs := make([][]pagehash.Hash, 6)
		for d := range docs {
			for i := range 12 {
				docs[d] = append(docs[d], PageHash(fmt.Sprintf("d%d-%d", d, i)))
			}
		}
		durable := map[pagehash.Hash]bool{}
		var prev Ready
		prevSnap := fmt.Sprintf("%+v", prev)
		type kept struct {
			rd   Ready
			snap string
			step int
		}
		var older []kept
		req := ReqID(0)
		for step := range 200 {
			for range 1 + rng.IntN(3) {
				req++
				d := docs[rng.IntN(len(docs))]
				key := d[:1+rng.IntN(len(d))]
				if err := m.Apply(Event{Kind: EvMatch, Req: req, Pages: len(key), Hashes: key}); err != nil {
					t.Fatalf("seed %d step %d: match: %v", seed, step, err)
				}
				if r := m.reqs[req]; r != nil && r.held {
					// Held for a reload: it lands or expires at a later tick.
					continue
				}
				for _, e := range []Event{{Kind: EvInsert, Req: req, Pages: len(key), Hashes: key}, {Kind: EvFinish, Req: req}, {Kind: EvRelease, Req: req}} {
					if err := m.Apply(e); err != nil {
						t.Fatalf("seed %d step %d: %v: %v", seed, step, e.Kind, err)
					}
				}
			}
			// The Ready handed out one Advance ago is still what it was.
			if got := fmt.Sprintf("%+v", prev); got != prevSnap {
				t.Fatalf("seed %d step %d: the last Ready changed before the next Advance:\nwas %s\nnow %s", seed, step, prevSnap, got)
			}
			rd := m.Output()
			snap := fmt.Sprintf("%+v", rd)
			m.Advance()
			carryOut(t, m, rd, durable)
			f, err := Reduce(m.Contribution())
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Tick(f); err != nil {
				t.Fatalf("seed %d step %d: tick: %v", seed, step, err)
			}
			if got := fmt.Sprintf("%+v", rd); got != snap {
				t.Fatalf("seed %d step %d: a Ready changed after its Advance:\nwas %s\nnow %s", seed, step, snap, got)
			}
			for _, k := range older {
				if got := ownSlices(k.rd); got != k.snap {
					t.Fatalf("seed %d step %d: the own slices of step %d's Ready changed:\nwas %s\nnow %s", seed, step, k.step, k.snap, got)
				}
			}
			older = append(older, kept{rd, ownSlices(rd), step})
			if len(older) > 8 {
				older = older[1:]
			}
			prev, prevSnap = rd, snap
		}
	}
}

// ownSlices renders the slices of a Ready that are the driver's to keep,
// leaving out the work (copies, puts, lookups, gets, deletes, touches),
// which lives until the next Advance only.
func ownSlices(rd Ready) string {
	return fmt.Sprintf("%+v %+v %+v %+v %+v", rd.Matches, rd.Placements, rd.Holds, rd.Unholds, rd.Skips)
}

// carryOut finishes every op of rd at once and ok, with a Store that
// holds what was put.
func carryOut(t *testing.T, m *Machine, rd Ready, durable map[pagehash.Hash]bool) {
	t.Helper()
	seen := map[OpID]bool{}
	for _, c := range rd.Copies {
		if !seen[c.Op] {
			seen[c.Op] = true
			if err := m.Done(c.Op, StageCopied, true); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, p := range rd.Puts {
		for _, st := range []Stage{StageGathered, StageDurable} {
			if err := m.Done(p.Op, st, true); err != nil {
				t.Fatal(err)
			}
		}
		for _, h := range p.Hashes {
			durable[h] = true
		}
	}
	for _, l := range rd.Lookups {
		n := 0
		for n < len(l.Hashes) && durable[l.Hashes[n]] {
			n++
		}
		if err := m.Longest(l.Op, n); err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range rd.Gets {
		if err := m.Done(g.Op, StageLoaded, true); err != nil {
			t.Fatal(err)
		}
	}
}

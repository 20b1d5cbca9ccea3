package control

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"
)

// replica is one rank in the property test: a Machine and the local ops it
// has yet to finish.
type replica struct {
	m    *Machine
	rng  *rand.Rand
	todo []localTask
}

type localTask struct {
	op      OpID
	stage   Stage
	longest int // lookup: the most pages it may answer
}

// collect turns the Machine's Ready into local tasks and consumes it.
func (r *replica) collect() Ready {
	rd := r.m.Ready()
	r.m.Advance()
	seen := map[OpID]bool{}
	for _, c := range rd.Copies {
		if !seen[c.Op] {
			seen[c.Op] = true
			r.todo = append(r.todo, localTask{op: c.Op, stage: StageCopied})
		}
	}
	for _, p := range rd.Puts {
		r.todo = append(r.todo, localTask{op: p.Op, stage: StageGathered})
	}
	for _, l := range rd.Lookups {
		r.todo = append(r.todo, localTask{op: l.Op, stage: StageFound, longest: len(l.Hashes)})
	}
	for _, g := range rd.Gets {
		r.todo = append(r.todo, localTask{op: g.Op, stage: StageLoaded})
	}
	return rd
}

// work finishes a random share of the local tasks, in a random order, each
// failing with probability failP: ranks drain their acks at different
// times and in different orders.
func (r *replica) work(t *testing.T, share, failP float64) {
	r.rng.Shuffle(len(r.todo), func(i, j int) { r.todo[i], r.todo[j] = r.todo[j], r.todo[i] })
	var keep []localTask
	for _, task := range r.todo {
		if r.rng.Float64() >= share {
			keep = append(keep, task)
			continue
		}
		ok := r.rng.Float64() >= failP
		var err error
		switch task.stage {
		case StageFound:
			err = r.m.Longest(task.op, r.rng.IntN(task.longest+1))
		default:
			err = r.m.Done(task.op, task.stage, ok)
		}
		if err != nil {
			t.Fatalf("local done op %d stage %s: %v", task.op, task.stage, err)
		}
		if task.stage == StageGathered {
			keep = append(keep, localTask{op: task.op, stage: StageDurable})
		}
	}
	r.todo = keep
}

func propertyOptions() Options {
	o := DefaultOptions()
	o.L1Pages, o.L2 = 24, SimpleLayout(20, 4096)
	o.SpillQueueCap, o.SpillInflight = 6, 2
	o.ReloadMaxInflight, o.ReloadTTL = 2, 3
	o.FreeRoomRatio = 0.1
	o.DigestEvery = 4
	o.Logger = slog.New(slog.DiscardHandler)
	return o
}

// TestReplicasAgree feeds three replicas the same replicated events while
// each finishes its ops in its own order, with its own delays and its own
// failures, each losing and regaining L3 on its own, and asserts equal
// digests at every tick and identical decisions (skips, holds) throughout.
func TestReplicasAgree(t *testing.T) {
	for _, wp := range []WritePolicy{WriteThrough, WriteThroughSelective, WriteBack} {
		for seed := uint64(1); seed <= 12; seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", wp, seed), func(t *testing.T) {
				defer func() {
					if t.Failed() {
						t.Logf("seed %d, policy %s", seed, wp)
					}
				}()
				runReplicas(t, seed, wp, 300)
			})
		}
	}
}

func runReplicas(t *testing.T, seed uint64, wp WritePolicy, steps int) {
	opts := propertyOptions()
	opts.WritePolicy = wp
	opts.EvictAhead = []float64{0, 1.0 / 16, 0.25}[seed%3]
	reps := make([]*replica, 3)
	for i := range reps {
		m, err := New(opts)
		if err != nil {
			t.Fatal(err)
		}
		reps[i] = &replica{m: m, rng: rand.New(rand.NewPCG(seed, uint64(i)+100))}
	}
	gen := rand.New(rand.NewPCG(seed, 7))
	held := map[ReqID]bool{}
	live := map[ReqID]bool{}
	nextReq := ReqID(1)
	apply := func(line string) {
		e, err := ParseEvent(line)
		if err != nil {
			t.Fatalf("generated %q: %v", line, err)
		}
		var first string
		for i, r := range reps {
			err := r.m.Apply(e)
			msg := fmt.Sprint(err)
			if i == 0 {
				first = msg
			} else if msg != first {
				t.Fatalf("%q: replica %d says %q, replica 0 %q", line, i, msg, first)
			}
		}
		var decisions string
		for i, r := range reps {
			rd := r.collect()
			d := fmt.Sprint(rd.Skips, rd.Holds, rd.Unholds, len(rd.Copies), len(rd.Puts), len(rd.Gets))
			if i == 0 {
				decisions = d
				for _, h := range rd.Holds {
					held[h] = true
				}
				for _, u := range rd.Unholds {
					delete(held, u.Req)
				}
			} else if d != decisions {
				t.Fatalf("after %q: replica %d decided %s, replica 0 %s", line, i, d, decisions)
			}
		}
	}
	tick := func() {
		cs := make([]Contribution, len(reps))
		for i, r := range reps {
			cs[i] = r.m.Contribution()
		}
		f, err := Reduce(cs...)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range reps {
			if err := r.m.Tick(f); err != nil {
				t.Fatalf("replica %d tick %d: %v", i, f.Tick, err)
			}
		}
		var want [32]byte
		var decisions string
		for i, r := range reps {
			rd := r.collect()
			d := fmt.Sprint(rd.Skips, rd.Holds, rd.Unholds, len(rd.Puts), len(rd.Gets), len(rd.Deletes))
			got := r.m.Digest()
			if i == 0 {
				want, decisions = got, d
				for _, u := range rd.Unholds {
					delete(held, u.Req)
				}
				continue
			}
			if got != want {
				t.Fatalf("tick %d: replica %d digest %x, replica 0 %x", f.Tick, i, got[:6], want[:6])
			}
			if d != decisions {
				t.Fatalf("tick %d: replica %d decided %s, replica 0 %s", f.Tick, i, d, decisions)
			}
		}
		if err := reps[0].m.CheckInvariants(); err != nil {
			t.Fatalf("tick %d: %v", f.Tick, err)
		}
	}
	key := func() string {
		doc := gen.IntN(4)
		n := 1 + gen.IntN(8)
		fork := gen.IntN(3)
		names := make([]string, n)
		for i := range names {
			if i >= 4 && fork > 0 {
				names[i] = fmt.Sprintf("d%dv%dp%d", doc, fork, i)
			} else {
				names[i] = fmt.Sprintf("d%dp%d", doc, i)
			}
		}
		return fmt.Sprint(names)[1 : len(fmt.Sprint(names))-1]
	}
	csv := func(s string) string {
		b := []byte(s)
		for i := range b {
			if b[i] == ' ' {
				b[i] = ','
			}
		}
		return string(b)
	}
	for step := 0; step < steps; step++ {
		switch x := gen.IntN(10); {
		case x < 4:
			req := nextReq
			nextReq++
			live[req] = true
			k := csv(key())
			apply(fmt.Sprintf("match req=%d hashes=%s", req, k))
			if !held[req] {
				apply(fmt.Sprintf("insert req=%d hashes=%s", req, k))
			}
		case x < 6 && len(live) > 0:
			ids := sortedKeys(live)
			req := ids[gen.IntN(len(ids))]
			apply(fmt.Sprintf("finish req=%d", req))
			apply(fmt.Sprintf("release req=%d", req))
			delete(live, req)
		case x < 7:
			if len(live) == 0 && gen.IntN(4) == 0 {
				apply("flush")
			}
		case x < 8:
			// The engine's waiting queue: a new hint of up to 3 keys.
			apply("upcoming")
			for range gen.IntN(4) {
				apply("upcoming hashes=" + csv(key()))
			}
		}
		for _, r := range reps {
			var err error
			r.work(t, 0.5, 0.05)
			// A rank loses or regains L3 on its own; the group learns it
			// at the next frontier (AND of the tier bits).
			switch {
			case r.rng.IntN(100) == 0:
				err = r.m.SetTierUp(3, false)
			case r.rng.IntN(5) == 0:
				err = r.m.SetTierUp(3, true)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if gen.IntN(3) == 0 {
			tick()
		}
	}
	// Drain: release everything, finish every op, tick until quiet, flush.
	for _, r := range reps {
		if err := r.m.SetTierUp(3, true); err != nil {
			t.Fatal(err)
		}
	}
	for _, req := range sortedKeys(live) {
		apply(fmt.Sprintf("release req=%d", req))
	}
	for i := 0; i < 40 && reps[0].m.ops.Len() > 0; i++ {
		for _, r := range reps {
			r.work(t, 1, 0)
		}
		tick()
	}
	if n := reps[0].m.ops.Len(); n > 0 {
		t.Fatalf("%d ops still in flight after the drain", n)
	}
	t.Logf("tick %d, stats %v", reps[0].m.Ticks(), reps[0].m.Stats())
	apply("flush")
	fresh, _ := New(opts)
	if got := reps[0].m.Digest(); got != fresh.Digest() {
		t.Fatalf("flushed digest %x, a new machine's %x", got[:6], fresh.Digest())
	}
}

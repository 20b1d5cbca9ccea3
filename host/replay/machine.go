package replay

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"slices"

	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/pagehash"
)

// MachineResult is a metadata replay through a control Machine.
type MachineResult struct {
	// Requests and InputPages count what was replayed; HitPages the pages
	// hit, by tier (index 1..3).
	Requests   int
	InputPages int64
	HitPages   [4]int64
	// PageEvents counts the pages named by matches and inserts.
	PageEvents int64
	// Steps counts the engine steps and Ticks the Machine's ticks (one a
	// step).
	Steps, Ticks uint64
	// Rematches counts the requests matched again after their reload
	// landed.
	Rematches int
}

// HitRate is the page hit rate.
func (r MachineResult) HitRate() float64 {
	if r.InputPages == 0 {
		return 0
	}
	return float64(r.HitPages[1]+r.HitPages[2]+r.HitPages[3]) / float64(r.InputPages)
}

// DefaultStepRequests is the new requests an engine step admits in a
// MachineReplay unless told otherwise (`kvtier bench host
// --step-requests`).
const DefaultStepRequests = 32

// MachineConfig shapes a MachineReplay.
type MachineConfig struct {
	// Requests replays the trace's first Requests requests (0: all).
	Requests int
	// StepRequests is the number of new requests each engine step admits
	// (0: DefaultStepRequests).
	StepRequests int
}

// MaxHeldSteps bounds how many steps a request may stay held before a
// stepping replay (this one, the data replay) calls it stuck: the
// Machine's ReloadTTL releases it far sooner.
const MaxHeldSteps = 1000

// RematchDue reports whether a request the Machine released from its hold
// matches again before it prefills: once, and only when its reload landed
// (Loaded) or its pages were already there (Present); a request released to
// recompute, or held again after its rematch, prefills with what its last
// match found.
func RematchDue(tries int, reason control.HoldReason) bool {
	return tries == 0 && (reason == control.Loaded || reason == control.Present)
}

// MachineReplay drives a control Machine with tr in metadata mode, the way
// an engine steps: each step matches up to StepRequests new requests in
// trace order, matches again the requests whose reload landed at the last
// tick, prefills (inserts, finishes and releases) every request matched
// and not held, and then ticks once. Every op finishes at once and ok, the
// Store is a set of durable pages, and the group is one rank reduced with
// control.Reduce. It is the decision half of a data replay without the
// tiers.
//
// A held request waits in later steps while the others go on, as in an
// engine's waiting queue; its reload lands two ticks after its match (the
// lookup, then the get), and it is matched once more when it was Loaded or
// Present. The requests of one step match before any of them inserts, so
// a page two requests of one step share is a miss for both.
func MachineReplay(tr *Trace, o control.Options, cfg MachineConfig) (MachineResult, error) {
	m, err := control.New(o)
	if err != nil {
		return MachineResult{}, err
	}
	step := cfg.StepRequests
	switch {
	case step < 0:
		return MachineResult{}, fmt.Errorf("machine replay: %d requests a step: want 0 (the default, %d) or more", step, DefaultStepRequests)
	case step == 0:
		step = DefaultStepRequests
	}
	r := &machineRun{m: m, durable: make([]bool, tr.UniqueBlocks())}
	n := tr.Requests()
	if cfg.Requests > 0 && cfg.Requests < n {
		n = cfg.Requests
	}
	// NB: every step admits a new request while any is left, and step
	// fails a request held MaxHeldSteps steps: the loop ends.
	for next := 0; next < n || len(r.held) > 0; {
		if err := r.step(tr, &next, n, step); err != nil {
			return r.res, fmt.Errorf("machine replay: step %d: %w", r.res.Steps+1, err)
		}
		r.res.Steps++
	}
	r.res.Ticks = m.Ticks()
	return r.res, nil
}

// DecisionOptions are the Machine options of the host/decisions benchmark
// (`kvtier bench host`, BenchmarkMachineReplay): L1 2000 pages, L2 4000
// pages, L3 on, a spill queue of 1024 with 64 in flight, 64 reloads in
// flight held at most 64 ticks, no digests, no log lines. 64 reloads are
// two steps of DefaultStepRequests: a reload lands two ticks after its
// match. With 16, on the Mooncake trace at a step of 32 requests, half the
// held requests found no reload slot and the page hit rate fell from 53%
// to 32%.
func DecisionOptions() control.Options {
	o := control.DefaultOptions()
	o.L1Pages, o.L2 = 2000, control.SimpleLayout(4000, 4096)
	o.SpillQueueCap, o.SpillInflight = 1024, 64
	o.ReloadMaxInflight, o.ReloadTTL = 2*DefaultStepRequests, 64
	o.DigestEvery = 0
	o.Logger = slog.New(slog.DiscardHandler)
	return o
}

// IdleTicks runs n ticks of the tick protocol MachineReplay drives — the
// contribution, its reduction, the tick, the output — on a new Machine with
// nothing in flight: the floor under the ticks of a replay.
func IdleTicks(o control.Options, n uint64) error {
	m, err := control.New(o)
	if err != nil {
		return err
	}
	for range n {
		f, err := control.Reduce(m.Contribution())
		if err != nil {
			return err
		}
		if err := m.Tick(f); err != nil {
			return err
		}
		_ = m.Output()
		m.Advance()
	}
	return nil
}

// waiter is a request between its first match and its prefill: held for a
// reload, unheld and due to match again, or prefilling this step.
type waiter struct {
	req control.ReqID
	key []pagehash.Hash
	// first is the first match's result, res the last one's.
	first, res control.MatchResult
	// tries counts the matches after the first; since, the step it was
	// first held, bounds the wait.
	tries  int
	since  uint64
	unheld bool
	reason control.HoldReason
}

type machineRun struct {
	m *control.Machine
	// durable is the Store: the trace's blocks spilled, by dense index
	// (BlockKey; as the bare replay, no map).
	durable []bool
	res     MachineResult
	seen    []control.OpID
	// held wait for a reload; fill prefill this step.
	held, fill []waiter
}

// step runs one engine step: the requests unheld at the last tick match
// again (or go on), up to step new ones match, the ops they issued finish,
// every request not held prefills, and the Machine ticks.
func (r *machineRun) step(tr *Trace, next *int, n, step int) error {
	// The ops the last tick issued finish, and its unholds are read.
	if err := r.drain(); err != nil {
		return err
	}
	r.fill = r.fill[:0]
	kept := r.held[:0]
	for _, w := range r.held {
		switch {
		case !w.unheld:
			if r.res.Steps-w.since > MaxHeldSteps {
				return fmt.Errorf("request %d held for %d steps", w.req, MaxHeldSteps)
			}
			kept = append(kept, w)
			continue
		case !RematchDue(w.tries, w.reason):
			r.fill = append(r.fill, w)
			continue
		}
		res, err := r.match(w.req, w.key)
		if err != nil {
			return err
		}
		r.res.Rematches++
		if res.Held {
			// Held again (the reload left a suffix to look up): it waits
			// once more and then prefills with this match.
			w.tries++
			w.unheld, w.res = false, res
			kept = append(kept, w)
			continue
		}
		w.res = res
		r.fill = append(r.fill, w)
	}
	r.held = kept
	for k := 0; k < step && *next < n; k++ {
		i := *next
		*next++
		key, _, _ := tr.request(i)
		req := control.ReqID(i + 1)
		r.res.InputPages += int64(len(key))
		res, err := r.match(req, key)
		if err != nil {
			return fmt.Errorf("request %d: %w", req, err)
		}
		if res.Held {
			r.held = append(r.held, waiter{req: req, key: key, first: res, res: res, since: r.res.Steps})
			continue
		}
		r.fill = append(r.fill, waiter{req: req, key: key, first: res, res: res})
	}
	// The matches' load-backs and lookups finish before the prefills.
	if err := r.drain(); err != nil {
		return err
	}
	for _, p := range r.fill {
		r.res.Requests++
		r.res.HitPages[1] += int64(p.first.L1)
		r.res.HitPages[2] += int64(p.first.L2)
		r.res.HitPages[3] += int64(max(0, p.res.L1+p.res.L2-p.first.L1-p.first.L2))
		if err := r.m.Apply(control.Event{Kind: control.EvInsert, Req: p.req, Pages: len(p.key), Hashes: p.key}); err != nil {
			return fmt.Errorf("request %d: insert: %w", p.req, err)
		}
		r.res.PageEvents += int64(len(p.key))
		if err := r.m.Apply(control.Event{Kind: control.EvFinish, Req: p.req}); err != nil {
			return fmt.Errorf("request %d: finish: %w", p.req, err)
		}
		if err := r.m.Apply(control.Event{Kind: control.EvRelease, Req: p.req}); err != nil {
			return fmt.Errorf("request %d: release: %w", p.req, err)
		}
	}
	return r.tick()
}

// match applies a match event and returns its result.
func (r *machineRun) match(req control.ReqID, key []pagehash.Hash) (control.MatchResult, error) {
	if err := r.m.Apply(control.Event{Kind: control.EvMatch, Req: req, Pages: len(key), Hashes: key}); err != nil {
		return control.MatchResult{}, err
	}
	r.res.PageEvents += int64(len(key))
	// NB: Output, not Ready: pending output accumulates until the next
	// drain's Advance, so this match's result is the last one.
	rd := r.m.Output()
	return rd.Matches[len(rd.Matches)-1], nil
}

// drain finishes at once, ok, every op the Machine asked for since the last
// drain (a local fact, applied at the next tick), and marks the held
// requests the Machine released.
func (r *machineRun) drain() error {
	// NB: Output, not Ready: the contribution is taken at the tick, as
	// host.Node does; Ready builds one per call.
	rd := r.m.Output()
	r.m.Advance()
	for _, u := range rd.Unholds {
		for i := range r.held {
			if w := &r.held[i]; w.req == u.Req && !w.unheld {
				w.unheld, w.reason = true, u.Reason
				break
			}
		}
	}
	// NB: a drain sees a few ops' copies: a list beats a map.
	r.seen = r.seen[:0]
	for _, c := range rd.Copies {
		if !slices.Contains(r.seen, c.Op) {
			r.seen = append(r.seen, c.Op)
			if err := r.m.Done(c.Op, control.StageCopied, true); err != nil {
				return err
			}
		}
	}
	for _, p := range rd.Puts {
		if err := r.m.Done(p.Op, control.StageGathered, true); err != nil {
			return err
		}
		if err := r.m.Done(p.Op, control.StageDurable, true); err != nil {
			return err
		}
		for i := range p.Hashes {
			d, err := r.dense(&p.Hashes[i])
			if err != nil {
				return fmt.Errorf("put op %d: %w", p.Op, err)
			}
			r.durable[d] = true
		}
	}
	for _, l := range rd.Lookups {
		n := 0
		for ; n < len(l.Hashes); n++ {
			d, err := r.dense(&l.Hashes[n])
			if err != nil {
				return fmt.Errorf("lookup op %d: %w", l.Op, err)
			}
			if !r.durable[d] {
				break
			}
		}
		if err := r.m.Longest(l.Op, n); err != nil {
			return err
		}
	}
	for _, g := range rd.Gets {
		if err := r.m.Done(g.Op, control.StageLoaded, true); err != nil {
			return err
		}
	}
	return nil
}

// dense returns the dense index of a trace key (BlockKey), or an error for
// a key the trace never gave the Machine.
func (r *machineRun) dense(h *pagehash.Hash) (uint32, error) {
	d := denseOf(h)
	if int(d) >= len(r.durable) || binary.LittleEndian.Uint64(h[8:16]) != ^binary.LittleEndian.Uint64(h[0:8]) {
		return 0, fmt.Errorf("page %x is no key of the trace", h[:8])
	}
	return d, nil
}

// tick finishes what is outstanding and applies the rank's own
// contribution as the frontier.
func (r *machineRun) tick() error {
	if err := r.drain(); err != nil {
		return err
	}
	f, err := control.Reduce(r.m.Contribution())
	if err != nil {
		return err
	}
	return r.m.Tick(f)
}

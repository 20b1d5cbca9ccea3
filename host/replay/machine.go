package replay

import (
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
	// Ticks counts the Machine's ticks (the driver ticks after every
	// event, and until a held request is released).
	Ticks uint64
}

// HitRate is the page hit rate.
func (r MachineResult) HitRate() float64 {
	if r.InputPages == 0 {
		return 0
	}
	return float64(r.HitPages[1]+r.HitPages[2]+r.HitPages[3]) / float64(r.InputPages)
}

// MachineReplay drives a control Machine with tr in metadata mode: every
// op finishes at once and ok, the Store is a set of durable pages, the
// group is one rank reduced with control.Reduce, a tick after every
// event. It is the decision half of a data replay without the tiers.
func MachineReplay(tr *Trace, o control.Options, requests int) (MachineResult, error) {
	m, err := control.New(o)
	if err != nil {
		return MachineResult{}, err
	}
	r := &machineRun{m: m, store: make(map[pagehash.Hash]struct{}, tr.UniqueBlocks())}
	n := tr.Requests()
	if requests > 0 && requests < n {
		n = requests
	}
	for i := range n {
		key, _, _ := tr.request(i)
		if err := r.request(control.ReqID(i+1), key); err != nil {
			return r.res, fmt.Errorf("machine replay: request %d: %w", i+1, err)
		}
		r.res.Requests++
	}
	r.res.Ticks = m.Ticks()
	return r.res, nil
}

// DecisionOptions are the Machine options of the host/decisions benchmark
// (`kvtier bench host`, BenchmarkMachineReplay): L1 2000 pages, L2 4000
// pages, L3 on, a spill queue of 1024 with 64 in flight, 16 reloads in
// flight held at most 64 ticks, no digests, no log lines.
func DecisionOptions() control.Options {
	o := control.DefaultOptions()
	o.L1Pages, o.L2 = 2000, control.SimpleLayout(4000, 4096)
	o.SpillQueueCap, o.SpillInflight = 1024, 64
	o.ReloadMaxInflight, o.ReloadTTL = 16, 64
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

type machineRun struct {
	m     *control.Machine
	store map[pagehash.Hash]struct{}
	res   MachineResult
	seen  []control.OpID
}

func (r *machineRun) drain() error {
	// NB: Output, not Ready: the contribution is taken at the tick, as
	// host.Node does; Ready builds one per call.
	rd := r.m.Output()
	r.m.Advance()
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
		for _, h := range p.Hashes {
			r.store[h] = struct{}{}
		}
	}
	for _, l := range rd.Lookups {
		n := 0
		for n < len(l.Hashes) {
			if _, ok := r.store[l.Hashes[n]]; !ok {
				break
			}
			n++
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

func (r *machineRun) tick() (control.Ready, error) {
	if err := r.drain(); err != nil {
		return control.Ready{}, err
	}
	f, err := control.Reduce(r.m.Contribution())
	if err != nil {
		return control.Ready{}, err
	}
	if err := r.m.Tick(f); err != nil {
		return control.Ready{}, err
	}
	return r.m.Output(), nil
}

func (r *machineRun) apply(e control.Event) (control.Ready, error) {
	if err := r.m.Apply(e); err != nil {
		return control.Ready{}, err
	}
	return r.m.Output(), nil
}

func (r *machineRun) request(req control.ReqID, key []pagehash.Hash) error {
	r.res.InputPages += int64(len(key))
	rd, err := r.apply(control.Event{Kind: control.EvMatch, Req: req, Pages: len(key), Hashes: key})
	if err != nil {
		return err
	}
	res := rd.Matches[len(rd.Matches)-1]
	first := res
	r.res.PageEvents += int64(len(key))
	for try := 0; res.Held; try++ {
		reason, err := r.waitUnhold(req)
		if err != nil {
			return err
		}
		if try > 0 || (reason != control.Loaded && reason != control.Present) {
			break
		}
		if rd, err = r.apply(control.Event{Kind: control.EvMatch, Req: req, Pages: len(key), Hashes: key}); err != nil {
			return err
		}
		res = rd.Matches[len(rd.Matches)-1]
		r.res.PageEvents += int64(len(key))
	}
	r.res.HitPages[1] += int64(first.L1)
	r.res.HitPages[2] += int64(first.L2)
	r.res.HitPages[3] += int64(max(0, res.L1+res.L2-first.L1-first.L2))
	if err := r.drain(); err != nil {
		return err
	}
	if _, err := r.apply(control.Event{Kind: control.EvInsert, Req: req, Pages: len(key), Hashes: key}); err != nil {
		return err
	}
	r.res.PageEvents += int64(len(key))
	if _, err := r.tick(); err != nil {
		return err
	}
	if _, err := r.apply(control.Event{Kind: control.EvFinish, Req: req}); err != nil {
		return err
	}
	if _, err := r.apply(control.Event{Kind: control.EvRelease, Req: req}); err != nil {
		return err
	}
	_, err = r.tick()
	return err
}

func (r *machineRun) waitUnhold(req control.ReqID) (control.HoldReason, error) {
	for range 1000 {
		rd, err := r.tick()
		if err != nil {
			return 0, err
		}
		if i := slices.IndexFunc(rd.Unholds, func(u control.Unhold) bool { return u.Req == req }); i >= 0 {
			return rd.Unholds[i].Reason, nil
		}
	}
	return 0, fmt.Errorf("request %d held for 1000 ticks", req)
}

// Package simrun is `kvtier sim`: N ranks, each a control Machine and a
// host.Node over its own real in-process tiers (a host L1 pool, an shm
// slab, a memstore L3), exchanging through the simulated rank group
// (host/consensus/simgroup: seeded per-rank arrival delays, operations
// failing on one rank, stalls, crashes) while a generated workload runs
// the same events on every rank. Tier acks are held back a random number
// of ticks per rank, so ranks finish the same op ticks apart. It counts
// digest checks, divergences, hangs, failed ops, the largest ack skew
// and wrong bytes; with InjectDivergence one rank applies an extra event
// and the run reports the tick the group caught it.
package simrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/host"
	"github.com/kvtier/kvtier/host/assemble"
	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/host/consensus/simgroup"
	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/host/stack"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/workload"
)

// Config configures a simulation.
type Config struct {
	// Ranks is the group size (1..64).
	Ranks int
	// Nodes is the number of simulated nodes the ranks are spread over,
	// Ranks/Nodes each (0: Ranks, a rank per node). The ranks of a node
	// share one control Machine (host.Multi) and the group exchange runs
	// between the nodes; each rank keeps its own tiers and engine.
	Nodes int
	// Ticks is how many ticks to run: requests start while the group's
	// tick is below it, the last one runs to its end, then every rank
	// runs DrainTicks(MaxAckSkew) more (Result.Ticks counts them all).
	Ticks uint64
	// Seed seeds the workload, the group's delays and faults and the ack
	// delays.
	Seed uint64
	// MaxAckSkew is the most ticks a tier ack is held back on a rank.
	MaxAckSkew int
	// OpFailRate is the probability an ok bit of a rank's contribution is
	// cleared (an op failing on that rank); 0 injects no failures.
	OpFailRate float64
	// Faults are stalls and crashes (simgroup faults).
	Faults []simgroup.Fault
	// InjectDivergence, when above zero, makes node 0 (and so each of its
	// ranks) apply an event the other nodes do not at that tick.
	InjectDivergence uint64
	// DigestEvery is the digest interval in ticks (default 16).
	DigestEvery uint64
	// Timeout is the exchange deadline (default 5 s).
	Timeout time.Duration
	// MaxPages caps a request's key (default 64 pages).
	MaxPages int
	// Dir holds the ranks' slab files (default a temporary directory).
	Dir string
	// Replicate turns owner lanes off: every rank moves every page, as a
	// group of data-parallel replicas would. By default the ranks are a
	// context-parallel group: page i of a key is rank i mod Ranks's, the
	// only one that holds its bytes (host.Options.Lanes).
	Replicate bool
	// EvictAhead overrides the Machine's EvictAhead (nil: the default,
	// control.DefaultEvictAhead).
	EvictAhead *float64
}

// Result is one simulation. The JSON keys are a public contract.
type Result struct {
	Ranks           int     `json:"ranks"`
	Nodes           int     `json:"nodes"`
	Ticks           uint64  `json:"ticks"`
	Requests        int64   `json:"requests"`
	DigestChecks    uint64  `json:"digest_checks"`
	Divergences     int     `json:"divergences"`
	Hangs           int     `json:"hangs"`
	FailedOps       int64   `json:"failed_ops"`
	MaxAckSkewTicks uint64  `json:"max_ack_skew_ticks"`
	VerifiedPages   int64   `json:"verified_pages"`
	WrongBytes      int64   `json:"wrong_bytes"`
	Seconds         float64 `json:"seconds"`
	TicksPerSecond  float64 `json:"ticks_per_second"`
	// InjectedAtTick is the tick node 0 applied the injected divergence
	// at (the end of the request in flight at Config.InjectDivergence).
	InjectedAtTick   uint64 `json:"injected_at_tick,omitempty"`
	CaughtAtTick     uint64 `json:"caught_at_tick,omitempty"`
	StoppedBy        string `json:"stopped_by,omitempty"`
	Seed             uint64 `json:"seed"`
	DigestEveryTicks uint64 `json:"digest_every_ticks"`
	// OwnerLanes: each rank moved only its own pages (Config.Replicate
	// off). The bytes are summed over the ranks, by path.
	OwnerLanes bool  `json:"owner_lanes"`
	L1ToL2     int64 `json:"l1_to_l2_bytes"`
	L2ToL3     int64 `json:"l2_to_l3_bytes"`
	L3ToL2     int64 `json:"l3_to_l2_bytes"`
	L2ToL1     int64 `json:"l2_to_l1_bytes"`
	// ForeignPages counts pages found in a rank's store that another lane
	// owns (with owner lanes; must be 0).
	ForeignPages int64 `json:"foreign_pages"`
	// EvictAhead is the Machines' EvictAhead. L1Admissions counts the L1
	// admissions (load-backs and inserts that needed room), L1Plans those
	// that ran the planner, L1CapacitySkips those skipped for want of
	// room: replicated counts, rank 0's.
	EvictAhead      float64 `json:"evict_ahead"`
	L1Admissions    uint64  `json:"l1_admissions"`
	L1Plans         uint64  `json:"l1_plans"`
	L1CapacitySkips uint64  `json:"l1_capacity_skips"`
	// InjectedFailedOps is the part of FailedOps the group injected
	// (ok bits cleared at Config.OpFailRate); the rest are ops the
	// ranks' tiers failed. Not in JSON: the text output splits the sum.
	InjectedFailedOps int64 `json:"-"`
}

// DrainTicks is how many ticks each rank runs after its last request, so
// the acks held back up to maxAckSkew ticks land and the op pipelines drain:
// Result.Ticks exceeds Config.Ticks by these and by the ticks the last
// request needed to finish (a request started below Config.Ticks runs to
// its end).
func DrainTicks(maxAckSkew int) uint64 { return uint64(4 * (maxAckSkew + 4)) }

// foreignPages asks each rank's store, page by page, for every page of the
// workload that another lane owns: with owner lanes none may be there.
func foreignPages(ctx context.Context, stacks []*stack.Stack, keys [][]pagehash.Hash) (int64, error) {
	pos := map[pagehash.Hash]int{}
	for _, k := range keys {
		for j, h := range k {
			pos[h] = j
		}
	}
	var n int64
	one := make([]pagehash.Hash, 1)
	for i, s := range stacks {
		st := s.Stores[0].Store
		for h, j := range pos {
			if control.OwnerOf(j, len(stacks)) == i {
				continue
			}
			one[0] = h
			got, err := st.LongestPrefix(ctx, 0, one)
			if err != nil {
				return n, fmt.Errorf("rank %d: lookup: %w", i, err)
			}
			n += int64(got)
		}
	}
	return n, nil
}

const stackYAML = `version: 1
model:
  page_tokens: 512
  payloads:
    - {name: kv, page_bytes: 4KiB}
tiers:
  - name: l1
    role: pool
    use: host
    config: {pages: 256, layers: 1, workers: 1}
  - name: l2
    role: slab
    use: l2hugetlb
    config: {size: 4MiB, fallback: shm, mount: "%[1]s/none", shm_dir: "%[1]s", name: "sim", stale: remove}
  - name: l3
    role: store
    use: memstore
    config: {capacity: 16MiB}
policy:
  evictor: adaptive
write_policy: write_through
`

// driver is what a node's loop asks of its host: a host.Node for a node
// of one rank, a host.Multi for a node of several.
type driver interface {
	Apply(ctx context.Context, e control.Event) (control.Ready, error)
	Tick(ctx context.Context) (control.Ready, error)
	Drain()
	Stats() host.Stats
	Close() error
}

// nodeRun is one simulated node: its ranks' tiers and engines, and the
// one Machine they share.
type nodeRun struct {
	idx    int
	first  int // the global index of its first rank
	stacks []*stack.Stack
	engs   []*host.SimEngine
	m      *control.Machine
	node   driver
	now    atomic.Uint64
	delays []*delayer
	refs   []control.PageRef
	checks uint64
}

// Run runs a simulation. An error is returned only for a setup failure:
// divergences, hangs and crashes are results.
func Run(ctx context.Context, cfg Config) (res Result, err error) {
	if cfg.Ranks < 1 || cfg.Ranks > 64 {
		return res, fmt.Errorf("sim: %d ranks, want 1..64", cfg.Ranks)
	}
	if cfg.Nodes == 0 {
		cfg.Nodes = cfg.Ranks
	}
	if cfg.Nodes < 1 || cfg.Nodes > cfg.Ranks || cfg.Ranks%cfg.Nodes != 0 {
		return res, fmt.Errorf("sim: %d ranks over %d nodes, want a node count that divides the ranks", cfg.Ranks, cfg.Nodes)
	}
	if cfg.DigestEvery == 0 {
		cfg.DigestEvery = 16
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.MaxPages <= 0 {
		cfg.MaxPages = 64
	}
	if cfg.MaxAckSkew < 0 || cfg.MaxAckSkew > 1000 {
		return res, fmt.Errorf("sim: max ack skew %d ticks, want 0..1000", cfg.MaxAckSkew)
	}
	res = Result{Ranks: cfg.Ranks, Nodes: cfg.Nodes, Seed: cfg.Seed, DigestEveryTicks: cfg.DigestEvery, OwnerLanes: !cfg.Replicate}
	if cfg.Dir == "" {
		base := ""
		if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
			base = "/dev/shm"
		}
		d, err := os.MkdirTemp(base, "kvtier-sim-")
		if err != nil {
			return res, fmt.Errorf("sim: %w", err)
		}
		defer os.RemoveAll(d)
		cfg.Dir = d
	}
	grp, err := simgroup.New(cfg.Nodes, simgroup.Options{Seed: cfg.Seed, OpFailRate: cfg.OpFailRate, Faults: cfg.Faults, Timeout: cfg.Timeout})
	if err != nil {
		return res, fmt.Errorf("sim: %w", err)
	}
	nodes := make([]*nodeRun, cfg.Nodes)
	defer func() {
		for _, nd := range nodes {
			if nd == nil {
				continue
			}
			if nd.node != nil {
				if cerr := nd.node.Close(); cerr != nil && err == nil {
					err = fmt.Errorf("sim: node %d: %w", nd.idx, cerr)
				}
			}
			for i, s := range nd.stacks {
				if cerr := s.Close(); cerr != nil && err == nil {
					err = fmt.Errorf("sim: rank %d: %w", nd.first+i, cerr)
				}
			}
		}
	}()
	for i := range nodes {
		if nodes[i], err = openNode(ctx, cfg, i, grp.Members()[i]); err != nil {
			return res, fmt.Errorf("sim: node %d: %w", i, err)
		}
	}
	gen := workload.DefaultGeneratorConfig()
	gen.Seed, gen.Requests = cfg.Seed, 4000
	reqs, err := workload.Generate(gen)
	if err != nil {
		return res, fmt.Errorf("sim: %w", err)
	}
	keys := make([][]pagehash.Hash, len(reqs))
	for i, rq := range reqs {
		keys[i] = chainKey(rq.HashIDs, cfg.MaxPages)
	}
	skew := newSkew(cfg.Nodes)
	start := time.Now()
	var wg sync.WaitGroup
	outs := make([]rankOut, cfg.Nodes)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i, nd := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = nd.run(rctx, cfg, keys, skew)
			if outs[i].err != nil {
				// The group stopped: release a node stalled in its
				// exchange (a stall blocks until its context ends).
				cancel()
			}
		}()
	}
	wg.Wait()
	res.Seconds = time.Since(start).Seconds()
	var stacks []*stack.Stack
	for i, o := range outs {
		nd := nodes[i]
		stacks = append(stacks, nd.stacks...)
		res.Ticks = max(res.Ticks, nd.m.Ticks())
		for _, e := range nd.engs {
			res.VerifiedPages += e.VerifiedPages
			res.WrongBytes += e.WrongBytes
		}
		st := nd.node.Stats()
		res.L1ToL2 += st.L1ToL2
		res.L2ToL3 += st.L2ToL3
		res.L3ToL2 += st.L3ToL2
		res.L2ToL1 += st.L2ToL1
		for _, n := range st.FailedOps {
			res.FailedOps += n
		}
		res.FailedOps += int64(grp.Members()[i].FailedOps())
		res.InjectedFailedOps += int64(grp.Members()[i].FailedOps())
		if i == 0 {
			res.Requests = o.requests
			res.DigestChecks = nd.checks
			res.EvictAhead = nd.m.Options().EvictAhead
			res.L1Admissions, res.L1Plans = nd.m.Count("l1 admit"), nd.m.Count("l1 plan")
			res.L1CapacitySkips = nd.m.Count(control.SkipCapacity.String() + " at l1 admit")
		}
		if o.err != nil && res.StoppedBy == "" {
			res.StoppedBy = o.err.Error()
		}
		var mm *consensus.MismatchError
		switch {
		// A divergence shows as differing digests, or earlier as a
		// contribution of another shape (the nodes issued different ops).
		case errors.As(o.err, &mm) || errors.Is(o.err, consensus.ErrShape):
			if res.CaughtAtTick == 0 || o.tick < res.CaughtAtTick {
				res.CaughtAtTick = o.tick
			}
		case errors.Is(o.err, consensus.ErrTimeout):
			res.Hangs = 1
		}
	}
	if res.CaughtAtTick > 0 {
		res.Divergences = 1
	}
	if cfg.InjectDivergence > 0 {
		res.InjectedAtTick = outs[0].injectedAt
	}
	res.MaxAckSkewTicks = skew.max()
	if !cfg.Replicate && cfg.Ranks > 1 {
		if res.ForeignPages, err = foreignPages(ctx, stacks, keys); err != nil {
			return res, fmt.Errorf("sim: %w", err)
		}
	}
	if res.Seconds > 0 {
		res.TicksPerSecond = float64(res.Ticks) / res.Seconds
	}
	return res, nil
}

// chainKey turns a trace request's block ids into page hashes (a prefix
// chain, so equal prefixes give equal keys), at most max pages.
func chainKey(ids []uint64, max int) []pagehash.Hash {
	n := min(len(ids), max)
	out := make([]pagehash.Hash, n)
	prev := pagehash.Root
	for i := range n {
		var t [2]uint32
		t[0], t[1] = uint32(ids[i]), uint32(ids[i]>>32)
		prev = pagehash.Next(prev, t[:])
		out[i] = prev
	}
	return out
}

// openNode opens node i's ranks (their stacks, engines and ack delays)
// and the Machine they share.
func openNode(ctx context.Context, cfg Config, i int, member consensus.Group) (_ *nodeRun, err error) {
	per := cfg.Ranks / cfg.Nodes
	nd := &nodeRun{idx: i, first: i * per}
	defer func() {
		if err != nil {
			for _, s := range nd.stacks {
				_ = s.Close()
			}
		}
	}()
	quiet := slog.New(slog.DiscardHandler)
	lanes := 1
	if !cfg.Replicate {
		lanes = cfg.Ranks
	}
	var locals []host.Local
	for j := range per {
		rank := nd.first + j
		dir := filepath.Join(cfg.Dir, fmt.Sprintf("rank%d", rank))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		st, regs, err := assemble.Load(fmt.Appendf(nil, stackYAML, dir), "sim stack")
		if err != nil {
			return nil, err
		}
		s, err := stack.Open(ctx, st, regs, stack.Options{Logger: quiet, StackID: fmt.Sprintf("sim-r%d", rank), ColdStart: tiers.ColdStartClear, IndexDir: dir})
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", rank, err)
		}
		nd.stacks = append(nd.stacks, s)
		pd := newDelayer(&nd.now, cfg.MaxAckSkew, cfg.Seed, uint64(2*rank+1))
		sd := newDelayer(&nd.now, cfg.MaxAckSkew, cfg.Seed, uint64(2*rank+2))
		nd.delays = append(nd.delays, pd, sd)
		realPool := s.Pool
		s.Pool = &delayPool{Pool: realPool, d: pd}
		s.Stores[0].Store = &delayStore{Store: s.Stores[0].Store, d: sd}
		eng, err := host.NewSimEngine(realPool, st.Payload)
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", rank, err)
		}
		lane := 0
		if lanes > 1 {
			lane = rank
		}
		if err := eng.OwnLane(lane, lanes); err != nil {
			return nil, err
		}
		nd.engs = append(nd.engs, eng)
		locals = append(locals, host.Local{Stack: s, Rank: lane, Engine: eng})
	}
	base := control.DefaultOptions()
	base.SpillQueueCap, base.SpillInflight = 1024, 64
	base.ReloadMaxInflight, base.ReloadTTL = 16, uint64(4*cfg.MaxAckSkew+64)
	base.DigestEvery = cfg.DigestEvery
	base.Logger = quiet
	if cfg.EvictAhead != nil {
		base.EvictAhead = *cfg.EvictAhead
	}
	mo, err := host.MachineOptions(nd.stacks[0], base, "")
	if err != nil {
		return nil, err
	}
	group := func(m *control.Machine) host.Group {
		return &countingGroup{ConsensusGroup: host.ConsensusGroup{G: member, M: m, DigestEvery: cfg.DigestEvery}, nd: nd}
	}
	opts := host.Options{Logger: quiet, SettleTimeout: 10 * time.Second, Lanes: lanes}
	if per == 1 {
		opts.Engine, opts.Rank = locals[0].Engine, locals[0].Rank
		nd.node, nd.m, err = assemble.Node(nd.stacks[0], mo, opts, group)
	} else {
		nd.node, nd.m, err = assemble.Multi(locals, mo, opts, group)
	}
	if err != nil {
		return nil, err
	}
	return nd, nil
}

// countingGroup counts the digest ticks a node exchanged successfully.
type countingGroup struct {
	host.ConsensusGroup
	nd *nodeRun
}

func (g *countingGroup) Exchange(ctx context.Context, tick uint64, c control.Contribution) (control.Frontier, error) {
	f, err := g.ConsensusGroup.Exchange(ctx, tick, c)
	if err == nil && g.DigestEvery > 0 && tick%g.DigestEvery == 0 {
		g.nd.checks++
	}
	return f, err
}

type rankOut struct {
	requests int64
	tick     uint64
	err      error
	// injectedAt is the tick node 0 applied the injected divergence at:
	// the end of the first request to finish at or after
	// Config.InjectDivergence, which may be some ticks later.
	injectedAt uint64
}

// run drives the node: the same requests, in the same order, as every
// other node; every loop bound reads replicated state only, so every node
// ticks the same number of times.
func (nd *nodeRun) run(ctx context.Context, cfg Config, keys [][]pagehash.Hash, sk *skew) (out rankOut) {
	tick := func() (control.Ready, error) {
		nd.node.Drain()
		rd, err := nd.node.Tick(ctx)
		if err != nil {
			return rd, err
		}
		nd.now.Store(nd.m.Ticks())
		sk.observe(nd.idx, nd.m.Ticks(), nd.m.Contribution())
		return rd, nil
	}
	apply := func(e control.Event) (control.Ready, error) { return nd.node.Apply(ctx, e) }
	injected := false
	for i := 0; nd.m.Ticks() < cfg.Ticks; i++ {
		key := keys[i%len(keys)]
		if len(key) == 0 {
			continue
		}
		req := control.ReqID(i + 1)
		if err := nd.request(req, key, apply, tick); err != nil {
			return rankOut{requests: out.requests, tick: nd.m.Ticks(), err: err, injectedAt: out.injectedAt}
		}
		out.requests++
		if nd.idx == 0 && !injected && cfg.InjectDivergence > 0 && nd.m.Ticks() >= cfg.InjectDivergence {
			injected = true
			out.injectedAt = nd.m.Ticks()
			h := pagehash.Next(pagehash.Root, []uint32{0xdead, uint32(cfg.Seed)})
			if _, err := apply(control.Event{Kind: control.EvInsert, Req: 1 << 62, Pages: 1, Hashes: []pagehash.Hash{h}}); err != nil {
				return rankOut{requests: out.requests, tick: nd.m.Ticks(), err: err, injectedAt: out.injectedAt}
			}
			if _, err := apply(control.Event{Kind: control.EvRelease, Req: 1 << 62}); err != nil {
				return rankOut{requests: out.requests, tick: nd.m.Ticks(), err: err, injectedAt: out.injectedAt}
			}
		}
	}
	// Let the held acks land and the op pipelines drain, within a bound.
	for range DrainTicks(cfg.MaxAckSkew) {
		if _, err := tick(); err != nil {
			return rankOut{requests: out.requests, tick: nd.m.Ticks(), err: err, injectedAt: out.injectedAt}
		}
	}
	out.tick = nd.m.Ticks()
	return out
}

// request runs one request on the node: match, wait out a reload hold
// (re-matching once when it landed), wait (bounded) for the load-backs to
// commit, verify each rank's L1 prefix byte for byte, insert, finish,
// release.
func (nd *nodeRun) request(req control.ReqID, key []pagehash.Hash, apply func(control.Event) (control.Ready, error), tick func() (control.Ready, error)) error {
	rd, err := apply(control.Event{Kind: control.EvMatch, Req: req, Pages: len(key), Hashes: key})
	if err != nil {
		return err
	}
	res := rd.Matches[len(rd.Matches)-1]
	for try := 0; res.Held; try++ {
		var reason control.HoldReason
		for n := 0; reason == 0; n++ {
			if n > 10000 {
				return fmt.Errorf("node %d: request %d held for %d ticks", nd.idx, req, n)
			}
			trd, err := tick()
			if err != nil {
				return err
			}
			if j := slices.IndexFunc(trd.Unholds, func(u control.Unhold) bool { return u.Req == req }); j >= 0 {
				reason = trd.Unholds[j].Reason
			}
		}
		if try > 0 || (reason != control.Loaded && reason != control.Present) {
			break
		}
		if rd, err = apply(control.Event{Kind: control.EvMatch, Req: req, Pages: len(key), Hashes: key}); err != nil {
			return err
		}
		res = rd.Matches[len(rd.Matches)-1]
	}
	want := res.L1 + res.L2
	for n := 0; ; n++ {
		nd.refs = nd.m.MatchedL1(req, nd.refs[:0])
		if len(nd.refs) >= want || n >= 4*64 {
			break
		}
		if _, err := tick(); err != nil {
			return err
		}
	}
	for _, e := range nd.engs {
		if _, err := e.Verify(nd.refs); err != nil {
			return err
		}
	}
	if _, err := apply(control.Event{Kind: control.EvInsert, Req: req, Pages: len(key), Hashes: key}); err != nil {
		return err
	}
	if _, err := tick(); err != nil {
		return err
	}
	if _, err := apply(control.Event{Kind: control.EvFinish, Req: req}); err != nil {
		return err
	}
	if _, err := apply(control.Event{Kind: control.EvRelease, Req: req}); err != nil {
		return err
	}
	_, err = tick()
	return err
}

// skew measures, per pipeline op, the ticks between the first rank
// finishing it and the last.
type skew struct {
	mu    sync.Mutex
	ranks int
	done  [][control.NumPipelines]uint64 // per rank: ops finished per pipeline
	first [control.NumPipelines]map[uint64]uint64
	worst uint64
}

func newSkew(ranks int) *skew {
	s := &skew{ranks: ranks, done: make([][control.NumPipelines]uint64, ranks)}
	for l := range s.first {
		s.first[l] = map[uint64]uint64{}
	}
	return s
}

func (s *skew) observe(rank int, tick uint64, c control.Contribution) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for l := range control.NumPipelines {
		d := c.Pipelines[l].Done
		for k := s.done[rank][l] + 1; k <= d; k++ {
			if _, ok := s.first[l][k]; !ok {
				s.first[l][k] = tick
			}
		}
		s.done[rank][l] = max(s.done[rank][l], d)
		lo := d
		for r := range s.ranks {
			lo = min(lo, s.done[r][l])
		}
		for k, t := range s.first[l] {
			if k <= lo {
				s.worst = max(s.worst, tick-t)
				delete(s.first[l], k)
			}
		}
	}
}

func (s *skew) max() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.worst
}

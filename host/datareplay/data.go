package datareplay

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvtier/kvtier/host"
	"github.com/kvtier/kvtier/host/assemble"
	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/host/replay"
	"github.com/kvtier/kvtier/host/stack"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/workload"
)

//go:embed data.yaml
var dataYAML string

// DataStackYAML returns the built-in small-page data stack with its
// directories under dir.
func DataStackYAML(dir string) string { return strings.ReplaceAll(dataYAML, "{{DIR}}", dir) }

// DataConfig configures a data-mode replay.
type DataConfig struct {
	// Stack is the stack config (nil: the built-in small-page stack under
	// Dir). It must have a host L1 pool.
	Stack *config.Stack
	// YAML, when Stack is nil, replaces the built-in stack's text ({{DIR}}
	// is replaced by Dir).
	YAML string
	// Dir holds the built-in stack's slab files, L3 and index.
	Dir string
	// ColdStart is what the stores do with a previous run's data
	// (default clear).
	ColdStart tiers.ColdStart
	// Requests replays only the first Requests requests (0: all).
	Requests int
	// StepRequests is the most new requests an engine step admits (0:
	// replay.DefaultStepRequests; 1: one request a step). A step admits
	// fewer when their pages and those of the requests still held would
	// not fit in L1.
	StepRequests int
	// Machine supplies the Machine options a stack does not decide
	// (queues, TTLs); zero value: control.DefaultOptions with the spill
	// queue and reload caps of a trace run.
	Machine *control.Options
	// Store names the store tier that is L3 (empty: the first).
	Store string
	// Progress, when set, is called with the number of requests done.
	Progress func(done int)
	// Logger receives the tiers' lines (nil: discarded).
	Logger *slog.Logger
	// Stores, when set, runs after the stack opened and may replace its
	// stores (tests put a fault-injecting store there); the returned
	// function closes what it opened.
	Stores func(ctx context.Context, s *stack.Stack) (func() error, error)
}

// DataBytes counts the bytes moved per path.
type DataBytes struct {
	L1ToL2 int64 `json:"l1_to_l2"`
	L2ToL3 int64 `json:"l2_to_l3"`
	L3ToL2 int64 `json:"l3_to_l2"`
	L2ToL1 int64 `json:"l2_to_l1"`
}

// DataResult is one data-mode replay. The JSON keys are a public contract.
type DataResult struct {
	// Mode is "data".
	Mode string `json:"mode"`
	// Policy is the stack's eviction policy (the tree's evictor; the
	// Machine's L1 and L2 victims follow its own replicated orders, see
	// docs/control.md).
	Policy string `json:"policy"`
	// Geometry says which page geometry and tier sizes ran.
	Geometry string `json:"geometry"`
	// Requests, InputTokens, HitTokens, HitRate: as in metadata mode, a
	// hit counted only for pages the engine read from L1 with the right
	// bytes.
	Requests    int     `json:"requests"`
	InputTokens int64   `json:"input_tokens"`
	HitTokens   int64   `json:"hit_tokens"`
	HitRate     float64 `json:"hit_rate"`
	// HitTokensByTier splits HitTokens by the tier the pages came from
	// when the request arrived (l1, l2, l3).
	HitTokensByTier map[string]int64 `json:"hit_tokens_by_tier"`
	// HitPagesByTier is the same in pages.
	HitPagesByTier map[string]int64 `json:"hit_pages_by_tier"`
	// VerifiedPages and WrongBytes: pages compared byte for byte and the
	// bytes that differed (must be 0).
	VerifiedPages int64 `json:"verified_pages"`
	WrongBytes    int64 `json:"wrong_bytes"`
	// Skips counts the Machine's skipped decisions by reason; FailedOps
	// the ops the tiers failed, by kind.
	Skips     map[string]int64 `json:"skips"`
	FailedOps map[string]int64 `json:"failed_ops"`
	// Bytes by path.
	Bytes DataBytes `json:"bytes"`
	// Steps is the number of engine steps (each admits at most
	// StepRequests new requests, and the held requests whose reload
	// landed match again), Ticks the number of frontier ticks: two a
	// step, and those that let the last spills land.
	Steps uint64 `json:"steps"`
	Ticks uint64 `json:"ticks"`
	// HitSequence is each request's hit pages (not in JSON; tests compare
	// runs).
	HitSequence []int `json:"-"`
	// Seconds is the wall time of the replay.
	Seconds float64 `json:"seconds"`
}

// DataTraceOptions returns the Machine options a data replay starts from:
// a spill queue of 1024 with 64 in flight, 64 reloads in flight held at
// most 64 ticks, no digests, no log lines.
//
// NB: 64 reloads are two steps of replay.DefaultStepRequests, as in
// replay.DecisionOptions: a step's held requests start their reloads
// together (the lookup lands at the step's first tick, the get at its
// second). With 16 (RunData with a Machine whose ReloadMaxInflight is
// 16), on the first 2000 requests of the generated workload at 32 requests
// a step, 527 reloads found no slot, L3 hits fell from 814 to 599 pages
// and the hit rate from 43.3% to 41.6% (`kvtier replay --data --requests
// 2000` gives the 64 side).
func DataTraceOptions() control.Options {
	o := control.DefaultOptions()
	o.SpillQueueCap, o.SpillInflight = 1024, 64
	o.ReloadMaxInflight, o.ReloadTTL = 2*replay.DefaultStepRequests, 64
	o.DigestEvery = 0
	o.Logger = slog.New(slog.DiscardHandler)
	return o
}

// LoadDataStack loads the built-in stack (or yaml) with dirs under dir.
func LoadDataStack(yaml, dir string) (*config.Stack, stack.Registries, error) {
	if yaml == "" {
		yaml = dataYAML
	}
	return assemble.Load([]byte(strings.ReplaceAll(yaml, "{{DIR}}", dir)), "data stack")
}

// RunData replays tr through a whole opened stack with bytes: one
// simulated engine rank with a host L1 pool writes every new page's
// payload (host.Payload of its hash), and every prefix hit, from any tier,
// is read from L1 where the engine would read it and compared byte for
// byte. The Machine decides everything; the Node carries it out; the
// group is host.Solo (world size 1, through the frontier). The engine
// steps: each step admits up to StepRequests new requests, as many as L1
// holds, and ticks twice (see dataRun.step); the tiers settle before
// every tick, so a run is deterministic.
func RunData(ctx context.Context, tr *replay.Trace, cfg DataConfig) (res DataResult, err error) {
	res = DataResult{Mode: "data", HitTokensByTier: map[string]int64{}, HitPagesByTier: map[string]int64{}}
	if cfg.StepRequests < 0 {
		return res, fmt.Errorf("replay --data: %d requests a step: want 0 (the default, %d) or more", cfg.StepRequests, replay.DefaultStepRequests)
	}
	st := cfg.Stack
	var regs stack.Registries
	if cfg.Dir == "" {
		return res, fmt.Errorf("replay --data: no directory for the stack")
	}
	for _, d := range []string{"shm", "l3", "index"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o755); err != nil {
			return res, fmt.Errorf("replay --data: %w", err)
		}
	}
	if st == nil {
		if st, regs, err = LoadDataStack(cfg.YAML, cfg.Dir); err != nil {
			return res, fmt.Errorf("replay --data: %w", err)
		}
	} else if _, regs, err = LoadDataStack("", cfg.Dir); err != nil {
		return res, fmt.Errorf("replay --data: %w", err)
	}
	cold := cfg.ColdStart
	if cold == "" {
		cold = tiers.ColdStartClear
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s, err := stack.Open(ctx, st, regs, stack.Options{Logger: logger, StackID: "replaydata", ColdStart: cold, IndexDir: filepath.Join(cfg.Dir, "index")})
	if err != nil {
		return res, fmt.Errorf("replay --data: %w", err)
	}
	defer func() {
		if cerr := s.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("replay --data: %w", cerr)
		}
	}()
	if cfg.Stores != nil {
		closeStores, err := cfg.Stores(ctx, s)
		if err != nil {
			return res, fmt.Errorf("replay --data: stores: %w", err)
		}
		if closeStores != nil {
			defer func() {
				if cerr := closeStores(); cerr != nil && err == nil {
					err = fmt.Errorf("replay --data: %w", cerr)
				}
			}()
		}
	}
	step := cfg.StepRequests
	if step == 0 {
		step = replay.DefaultStepRequests
	}
	base := DataTraceOptions()
	if cfg.Machine != nil {
		base = *cfg.Machine
	} else {
		// Two steps of reloads, for steps longer than the default too.
		base.ReloadMaxInflight = max(base.ReloadMaxInflight, 2*step)
	}
	mo, err := assemble.MachineOptions(s, base, cfg.Store, "data mode")
	if err != nil {
		return res, fmt.Errorf("replay --data: %w", err)
	}
	eng, err := host.NewSimEngine(s.Pool, st.Payload)
	if err != nil {
		return res, fmt.Errorf("replay --data: %w", err)
	}
	node, m, err := assemble.Node(s, mo, host.Options{Engine: eng, Store: cfg.Store, Logger: logger}, nil)
	if err != nil {
		return res, fmt.Errorf("replay --data: %w", err)
	}
	res.Policy = st.Policy.Evictor
	res.Geometry = geometry(st, s, mo, cfg.Store)
	n := tr.Requests()
	if cfg.Requests > 0 && cfg.Requests < n {
		n = cfg.Requests
	}
	d := &dataRun{ctx: ctx, node: node, m: m, eng: eng, tr: tr, l1Pages: int(mo.L1Pages)}
	res.HitSequence = make([]int, n)
	start := time.Now()
	var tierPages [4]int64
	var tierTokens [4]int64
	for next := 0; next < n || len(d.held) > 0; {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		// NB: no bound on the steps here: with L1 full of requests that
		// wait on reloads a step may admit none, so a run may take several
		// steps a request. dataRun.step bounds each request's wait
		// (replay.MaxHeldSteps), and a step with nothing admitted and
		// nothing held admits one.
		if err := d.step(&next, n, step, res.Steps); err != nil {
			return res, fmt.Errorf("replay --data: step %d: %w", res.Steps+1, err)
		}
		res.Steps++
		for _, p := range d.fill {
			res.Requests++
			res.InputTokens += int64(p.input)
			tot := 0
			prevTok := int64(0)
			for t := 1; t <= 3; t++ {
				tot += p.hits[t]
				tierPages[t] += int64(p.hits[t])
				tok := min(int64(tot)*workload.BlockTokens, int64(p.input))
				tierTokens[t] += tok - prevTok
				prevTok = tok
			}
			res.HitTokens += prevTok
			res.HitSequence[p.req-1] = tot
			if cfg.Progress != nil {
				// NB: once a request, not once a step: a caller may wait
				// for an exact count (TestDataSIGKILL kills at 300).
				cfg.Progress(res.Requests)
			}
		}
	}
	// Let the last spills land so bytes and durability are complete.
	for range 64 {
		if err := node.Settle(ctx); err != nil {
			return res, err
		}
		if len(m.SpillQueue()) == 0 && node.Outstanding() == 0 && !m.HasReady() {
			break
		}
		if _, err := node.Tick(ctx); err != nil {
			return res, err
		}
	}
	res.Seconds = time.Since(start).Seconds()
	for t, name := range []string{"", "l1", "l2", "l3"} {
		if t > 0 {
			res.HitPagesByTier[name] = tierPages[t]
			res.HitTokensByTier[name] = tierTokens[t]
		}
	}
	if res.InputTokens > 0 {
		res.HitRate = float64(res.HitTokens) / float64(res.InputTokens)
	}
	ns := node.Stats()
	res.Skips, res.FailedOps = ns.Skips, ns.FailedOps
	res.Bytes = DataBytes{L1ToL2: ns.L1ToL2, L2ToL3: ns.L2ToL3, L3ToL2: ns.L3ToL2, L2ToL1: ns.L2ToL1}
	res.Ticks = ns.Ticks
	res.VerifiedPages, res.WrongBytes = eng.VerifiedPages, eng.WrongBytes
	return res, nil
}

func geometry(st *config.Stack, s *stack.Stack, mo control.Options, store string) string {
	var b strings.Builder
	for i, k := range st.Payload.Kinds {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s pages", k.Name, quantity.Size(k.PageBytes))
	}
	fmt.Fprintf(&b, "; L1 %s %d pages; L2 %d pages", s.PoolName, mo.L1Pages, mo.L2.Kinds[0].Pages())
	for _, t := range s.Stores {
		if store == "" || t.Name == store {
			if c := t.Store.Stats().CapacityBytes; c > 0 {
				fmt.Fprintf(&b, "; L3 %s %s (%d pages)", t.Name, quantity.Size(c), c/st.Payload.Kinds[0].PageBytes)
			} else {
				fmt.Fprintf(&b, "; L3 %s", t.Name)
			}
			break
		}
	}
	return b.String()
}

// dataReq is a request of a data replay between its first match and its
// prefill: held for a reload, unheld and due to match again, or matched
// and prefilling this step.
type dataReq struct {
	req   control.ReqID
	key   []pagehash.Hash
	input int
	// first is the first match's result, res the last one's.
	first, res control.MatchResult
	// tries counts the matches after the first; since, the step it was
	// first held, bounds the wait.
	tries  int
	since  uint64
	unheld bool
	reason control.HoldReason
	// hits are the verified hit pages by tier (index 1..3), set when it
	// prefills.
	hits [4]int
}

// dataRun is the one-rank driver of a data replay. It steps as an engine
// does (replay.MachineReplay's step structure, with the Node carrying the
// ops out and a tick between the matches and the engine's reads).
type dataRun struct {
	ctx  context.Context
	node *host.Node
	m    *control.Machine
	eng  *host.SimEngine
	tr   *replay.Trace
	refs []control.PageRef
	// l1Pages is the L1's size in pages: a step's budget.
	l1Pages int
	// held waits for a reload; fill prefills this step (and holds the
	// step's results for RunData once the step is over).
	held []dataReq
	fill []dataReq
	// unholds are the releases seen since the step began, marked on held
	// when the next step begins (held is rewritten in place meanwhile).
	unholds []control.Unhold
}

// apply hands e to the Node and keeps the unholds its Ready carries.
func (d *dataRun) apply(e control.Event) (control.Ready, error) {
	rd, err := d.node.Apply(d.ctx, e)
	d.unholds = append(d.unholds, rd.Unholds...)
	return rd, err
}

// tick settles the tiers' acks and store results, so that every answer is
// in before the frontier (the run is deterministic), ticks, and keeps the
// tick's unholds.
func (d *dataRun) tick() error {
	if err := d.node.Settle(d.ctx); err != nil {
		return err
	}
	rd, err := d.node.Tick(d.ctx)
	d.unholds = append(d.unholds, rd.Unholds...)
	return err
}

// markUnheld marks the held requests the kept unholds release.
func (d *dataRun) markUnheld() {
	for _, u := range d.unholds {
		for i := range d.held {
			if w := &d.held[i]; w.req == u.Req && !w.unheld {
				w.unheld, w.reason = true, u.Reason
				break
			}
		}
	}
	d.unholds = d.unholds[:0]
}

// match applies a match event and returns its result.
func (d *dataRun) match(req control.ReqID, key []pagehash.Hash) (control.MatchResult, error) {
	rd, err := d.apply(control.Event{Kind: control.EvMatch, Req: req, Pages: len(key), Hashes: key})
	if err != nil {
		return control.MatchResult{}, err
	}
	return rd.Matches[len(rd.Matches)-1], nil
}

// step runs one engine step (steps counts the steps before it): the
// requests unheld since the last step match again (or go on), up to step
// new requests match while the pages of the requests admitted and not done
// fit in L1, a tick commits the matches' load-backs into L1, the
// engine reads and verifies every prefilling request's prefix from L1,
// each of them inserts, finishes and releases, and a tick ends the step.
// A held request waits in later steps while the others go on, as in an
// engine's waiting queue; it is matched once more when its reload was
// Loaded or Present, and a request held again waits once more and then
// prefills with that match.
//
// NB: the requests of one step all match before any of them inserts, so a
// prefix that two requests of one step share and no tier holds yet is a
// miss for both, as in an engine's batch (the second's insert finds the
// first's pages already in the tree).
func (d *dataRun) step(next *int, n, step int, steps uint64) error {
	d.markUnheld()
	d.fill = d.fill[:0]
	// used counts the L1 pages of the requests admitted and not done: the
	// whole key of each, held or prefilling (its prefix loaded back, its
	// new pages inserted and not evictable before their copy to L2 lands
	// at the step's last tick).
	used := 0
	kept := d.held[:0]
	for _, w := range d.held {
		used += len(w.key)
		switch {
		case !w.unheld:
			if steps-w.since > replay.MaxHeldSteps {
				return fmt.Errorf("request %d held for %d steps", w.req, replay.MaxHeldSteps)
			}
			kept = append(kept, w)
			continue
		case !replay.RematchDue(w.tries, w.reason):
			d.fill = append(d.fill, w)
			continue
		}
		res, err := d.match(w.req, w.key)
		if err != nil {
			return fmt.Errorf("request %d: match again: %w", w.req, err)
		}
		w.res = res
		if res.Held {
			w.tries++
			w.unheld = false
			kept = append(kept, w)
			continue
		}
		d.fill = append(d.fill, w)
	}
	d.held = kept
	for k := 0; k < step && *next < n; k++ {
		key, input, _ := d.tr.Request(*next)
		// NB: an engine admits a request to its batch only while the KV of
		// the batch and of the requests it waits on fits its memory (vLLM
		// allocates a request's blocks, loads included, when it schedules
		// it); here, while their pages fit in L1. Without this the
		// built-in stack's L1 of 256 pages takes 32 requests of the shared
		// trace (about 900 pages) at once, most inserts find no L1 room,
		// and the hit rate of its first 1000 requests falls from 17.3% to
		// 4.8% (the tests' memstore L3 stack, memstoreYAML, with this
		// budget taken out). With nothing admitted a request goes in
		// whatever its length.
		if used > 0 && used+len(key) > d.l1Pages {
			break
		}
		used += len(key)
		req := control.ReqID(*next + 1)
		*next++
		res, err := d.match(req, key)
		if err != nil {
			return fmt.Errorf("request %d: match: %w", req, err)
		}
		w := dataReq{req: req, key: key, input: input, first: res, res: res, since: steps}
		if res.Held {
			d.held = append(d.held, w)
			continue
		}
		d.fill = append(d.fill, w)
	}
	// The load-backs of the step's matches commit: MatchedL1 then names
	// the L1 pages the engine reads.
	if err := d.tick(); err != nil {
		return err
	}
	for i := range d.fill {
		p := &d.fill[i]
		d.refs = d.m.MatchedL1(p.req, d.refs[:0])
		good, err := d.eng.Verify(d.refs)
		if err != nil {
			return fmt.Errorf("request %d: verify: %w", p.req, err)
		}
		claimed := max(p.res.L1+p.res.L2, p.first.L1+p.first.L2)
		got := min(good, claimed)
		p.hits[1] = min(p.first.L1, got)
		p.hits[2] = min(p.first.L2, got-p.hits[1])
		p.hits[3] = got - p.hits[1] - p.hits[2]
	}
	for _, p := range d.fill {
		if _, err := d.apply(control.Event{Kind: control.EvInsert, Req: p.req, Pages: len(p.key), Hashes: p.key}); err != nil {
			return fmt.Errorf("request %d: insert: %w", p.req, err)
		}
		if _, err := d.apply(control.Event{Kind: control.EvFinish, Req: p.req}); err != nil {
			return fmt.Errorf("request %d: finish: %w", p.req, err)
		}
		if _, err := d.apply(control.Event{Kind: control.EvRelease, Req: p.req}); err != nil {
			return fmt.Errorf("request %d: release: %w", p.req, err)
		}
	}
	return d.tick()
}

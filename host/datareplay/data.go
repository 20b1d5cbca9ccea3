package datareplay

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
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
	// Ticks is the number of frontier ticks.
	Ticks uint64 `json:"ticks"`
	// HitSequence is each request's hit pages (not in JSON; tests compare
	// runs).
	HitSequence []int `json:"-"`
	// Seconds is the wall time of the replay.
	Seconds float64 `json:"seconds"`
}

// DataTraceOptions returns the Machine options a data replay starts from.
func DataTraceOptions() control.Options {
	o := control.DefaultOptions()
	o.SpillQueueCap, o.SpillInflight = 1024, 64
	o.ReloadMaxInflight, o.ReloadTTL = 16, 64
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
// group is host.Solo (world size 1, through the frontier).
func RunData(ctx context.Context, tr *replay.Trace, cfg DataConfig) (res DataResult, err error) {
	res = DataResult{Mode: "data", HitTokensByTier: map[string]int64{}, HitPagesByTier: map[string]int64{}}
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
	base := DataTraceOptions()
	if cfg.Machine != nil {
		base = *cfg.Machine
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
	d := &dataRun{ctx: ctx, node: node, m: m, eng: eng}
	n := tr.Requests()
	if cfg.Requests > 0 && cfg.Requests < n {
		n = cfg.Requests
	}
	start := time.Now()
	var tierPages [4]int64
	var tierTokens [4]int64
	for i := range n {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		key, input, _ := tr.Request(i)
		hits, err := d.request(control.ReqID(i+1), key)
		if err != nil {
			return res, fmt.Errorf("replay --data: request %d: %w", i+1, err)
		}
		res.Requests++
		res.InputTokens += int64(input)
		tot := 0
		prevTok := int64(0)
		for t := 1; t <= 3; t++ {
			tot += hits[t]
			tierPages[t] += int64(hits[t])
			tok := min(int64(tot)*workload.BlockTokens, int64(input))
			tierTokens[t] += tok - prevTok
			prevTok = tok
		}
		res.HitTokens += prevTok
		res.HitSequence = append(res.HitSequence, tot)
		if cfg.Progress != nil {
			cfg.Progress(i + 1)
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

// dataRun is the one-rank driver of a data replay.
type dataRun struct {
	ctx  context.Context
	node *host.Node
	m    *control.Machine
	eng  *host.SimEngine
	refs []control.PageRef
}

func (d *dataRun) apply(e control.Event) (control.Ready, error) {
	return d.node.Apply(d.ctx, e)
}

func (d *dataRun) tick() (control.Ready, error) {
	if err := d.node.Settle(d.ctx); err != nil {
		return control.Ready{}, err
	}
	return d.node.Tick(d.ctx)
}

// request runs one request: match (waiting out a reload hold, then
// matching again), the tick that commits its load-backs, the engine's read
// of its prefix from L1 (verified), insert, finish, release. It returns
// the verified hit pages by tier (index 1..3).
func (d *dataRun) request(req control.ReqID, key []pagehash.Hash) ([4]int, error) {
	var hits [4]int
	rd, err := d.apply(control.Event{Kind: control.EvMatch, Req: req, Pages: len(key), Hashes: key})
	if err != nil {
		return hits, err
	}
	res := rd.Matches[len(rd.Matches)-1]
	first := res
	for try := 0; res.Held; try++ {
		reason, err := d.waitUnhold(req)
		if err != nil {
			return hits, err
		}
		if try > 0 || (reason != control.Loaded && reason != control.Present) {
			break
		}
		if rd, err = d.apply(control.Event{Kind: control.EvMatch, Req: req, Pages: len(key), Hashes: key}); err != nil {
			return hits, err
		}
		res = rd.Matches[len(rd.Matches)-1]
	}
	if _, err := d.tick(); err != nil {
		return hits, err
	}
	d.refs = d.m.MatchedL1(req, d.refs[:0])
	good, err := d.eng.Verify(d.refs)
	if err != nil {
		return hits, err
	}
	claimed := max(res.L1+res.L2, first.L1+first.L2)
	got := min(good, claimed)
	hits[1] = min(first.L1, got)
	hits[2] = min(first.L2, got-hits[1])
	hits[3] = got - hits[1] - hits[2]
	if _, err := d.apply(control.Event{Kind: control.EvInsert, Req: req, Pages: len(key), Hashes: key}); err != nil {
		return hits, err
	}
	if _, err := d.tick(); err != nil {
		return hits, err
	}
	if _, err := d.apply(control.Event{Kind: control.EvFinish, Req: req}); err != nil {
		return hits, err
	}
	if _, err := d.apply(control.Event{Kind: control.EvRelease, Req: req}); err != nil {
		return hits, err
	}
	_, err = d.tick()
	return hits, err
}

// waitUnhold ticks until req is released and returns why.
func (d *dataRun) waitUnhold(req control.ReqID) (control.HoldReason, error) {
	for range 1000 {
		rd, err := d.tick()
		if err != nil {
			return 0, err
		}
		if i := slices.IndexFunc(rd.Unholds, func(u control.Unhold) bool { return u.Req == req }); i >= 0 {
			return rd.Unholds[i].Reason, nil
		}
	}
	return 0, fmt.Errorf("request %d held for 1000 ticks", req)
}

// Package host runs a rank's control Machine against an opened tier stack:
// the Node owns one host/control Machine, carries out what the Machine
// asks (L1↔L2 copies through the Pool, spills, lookups, reloads, deletes
// and touches through the Store below the slab, the store calls on the
// Node's own worker goroutine), feeds every completion back as a local
// fact (Done, Longest) and ticks the Machine through a Group when its
// driver says so. Its drivers are host/serve (`kvtier serve`, the engine
// API), host/datareplay (`kvtier replay --data`) and host/simrun
// (`kvtier sim`); each lets one goroutine at a time call its Node.
//
// The Node decides nothing: every decision is the Machine's. It must never
// let a tier error escape as a hang or a panic — a failed copy, put, get
// or lookup is a failed op (the Machine rolls back, misses, recomputes).
package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/host/placement"
	"github.com/kvtier/kvtier/host/stack"
	"github.com/kvtier/kvtier/internal/crc32c"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

// Group turns this rank's contribution at a tick into the group's
// frontier. host/consensus implements it for a real rank group; Solo is
// the group of one.
type Group interface {
	// Exchange offers c (for tick) and returns the reduced frontier.
	Exchange(ctx context.Context, tick uint64, c control.Contribution) (control.Frontier, error)
}

// Solo is the group of world size 1: the frontier is control.Reduce over
// the rank's own contribution, the same mechanism a larger group uses.
type Solo struct{}

// Exchange reduces the one contribution.
func (Solo) Exchange(_ context.Context, tick uint64, c control.Contribution) (control.Frontier, error) {
	if c.Tick != tick {
		return control.Frontier{}, fmt.Errorf("solo group: contribution for tick %d at tick %d: %w", c.Tick, tick, control.ErrFrontier)
	}
	return control.Reduce(c)
}

// Engine is the engine side of a Node: it writes the KV of newly placed
// L1 pages before the Node backs them up. Place is called synchronously,
// before any copy of the same Ready is issued.
type Engine interface {
	Place(p control.Placement, hashes []pagehash.Hash) error
}

// Options configure a Node.
type Options struct {
	// Group is the rank group (nil: Solo).
	Group Group
	// Engine writes placed pages (nil: nothing is written).
	Engine Engine
	// Store names the store tier the Machine's L3 is (empty: the first
	// store of the stack; none: no L3).
	Store string
	// Logger receives the Node's lines (nil: discarded).
	Logger *slog.Logger
	// SettleTimeout bounds how long Settle waits for acks before it fails
	// the ops still outstanding (0: 30 s). A tier that never answers is a
	// failed op, never a hang.
	SettleTimeout time.Duration
	// Lanes is the number of owner lanes (the context-parallel size) and
	// Rank this Node's lane. Page i of a key belongs to lane i mod Lanes
	// (control.OwnerOf): the Node copies only its own pages between L1 and
	// L2, puts, gets, deletes and touches only its own pages in the store,
	// and answers a lookup from its own pages (the group's MIN makes the
	// agreed count). An op with none of its pages finishes at once, ok, and
	// the frontier keeps the ranks in lockstep. 0 or 1: one lane, every
	// page.
	Lanes, Rank int
	// StoreQueue bounds the store lookups, gets, deletes and touches
	// issued to the Node's worker and not yet drained (0: 1024). An op
	// beyond it misses or fails at once (ErrStoreQueueFull): a stuck tier
	// never stalls the driver.
	StoreQueue int
}

// Stats counts what a Node moved and decided.
type Stats struct {
	// Bytes by path: L1→L2 backups, L2→L3 spills, L3→L2 reloads, L2→L1
	// load-backs (successful items only).
	L1ToL2, L2ToL3, L3ToL2, L2ToL1 int64
	// Skips by reason name (control.SkipReason.String()).
	Skips map[string]int64
	// FailedOps counts ops this rank reported failed, by kind ("copy",
	// "put", "get", "lookup", "timeout").
	FailedOps map[string]int64
	// SumFailures counts spilled pages whose slab bytes no longer matched
	// the engine's sum when a store that keeps no sums gathered them.
	SumFailures int64
	// Ticks is the number of ticks.
	Ticks uint64
}

// MachineOptions fills the stack-shaped fields of base from an opened
// stack: the L1 size from the pool, the L2 layout planned over the slab
// files, L3 on when a store sits below the slab, write policy and planner
// from the config. base supplies the rest (queues, TTLs, logging).
func MachineOptions(s *stack.Stack, base control.Options, storeName string) (control.Options, error) {
	if s == nil || s.Slab == nil {
		return base, fmt.Errorf("host: no stack or no slab")
	}
	if s.Pool == nil {
		return base, fmt.Errorf("host: the stack has no L1 pool (role: pool)")
	}
	o := base
	o.L1Pages = int64(s.Pool.Geometry().Pages)
	lay, err := placement.PlanLayout(s.Slab.Geometry().Slabs, s.Config.Payload, 0)
	if err != nil {
		return base, fmt.Errorf("host: plan the L2 layout: %w", err)
	}
	o.L2 = lay
	_, err = pickStore(s, storeName)
	if err != nil {
		return base, err
	}
	o.L3 = len(s.Stores) > 0
	if wp := string(s.Config.WritePolicy); wp != "" {
		if o.WritePolicy, err = control.ParseWritePolicy(wp); err != nil {
			return base, fmt.Errorf("host: %w", err)
		}
	}
	if pl := string(s.Config.Policy.Planner); pl != "" {
		o.Planner = pl
	}
	return o, nil
}

func pickStore(s *stack.Stack, name string) (tiers.Store, error) {
	if name == "" {
		if len(s.Stores) == 0 {
			return nil, nil
		}
		return s.Stores[0].Store, nil
	}
	for _, st := range s.Stores {
		if st.Name == name {
			return st.Store, nil
		}
	}
	return nil, fmt.Errorf("host: no store tier named %q in the stack", name)
}

// batch is one Pool copy batch or Store put batch in flight for one op.
type batch struct {
	op    control.OpID
	kind  string // "copy" or "put"
	dir   control.Direction
	bytes []int64 // per item
	// pages are the L2 pages a backup's items write, per item: where the
	// sums of a pool's acks or of the engine's completion go.
	pages []slabPage
	// sums (a put to a store that keeps no sums, when an item carries
	// the engine's): per item, what to check the slab against once the
	// store has gathered it.
	sums []putSum
	// state per item: 0 pending, 1 gathered, 2 terminal.
	state    []uint8
	gathered int
	terminal int
	failed   bool
	gFailed  bool
	okBytes  int64
}

// putSum is one put item's engine sum, checked against the slab when a
// store that keeps no sums of its own (not a tiers.SumKeeper) has
// gathered it: such a store computes its checksum over what it gathered,
// so a page changed in the slab since the engine wrote it would be
// stored under a valid-looking checksum of its own.
type putSum struct {
	span tiers.Span
	sum  uint32
	has  bool
	bad  bool // the slab no longer matched at the gather
}

// Node owns one Machine and runs it against a stack. It is not safe for
// concurrent use: the one goroutine that calls it owns the Machine.
type Node struct {
	// l1Pages is copyItems's scratch list of a copy's L1 pages.
	l1Pages []int64
	m       *control.Machine
	s       *stack.Stack
	store   tiers.Store
	// storeKeepsSums: the store keeps the put's sums as given
	// (tiers.SumKeeper); otherwise the Node checks the slab at the
	// gather of every put that carries an engine's sum.
	storeKeepsSums bool
	group          Group
	engine         Engine
	// facts takes the Node's local facts (Done, Longest): the Machine
	// itself, or, for a rank of a Multi, the Multi's reduction over its
	// local ranks.
	facts facts
	// multi: the Node is a local rank of a Multi, which applies events
	// and ticks; the Node only carries out.
	multi  bool
	log    *slog.Logger
	opts   Options
	layout placement.Layout
	kinds  int

	// plans is the L1 pool when the engine runs its copies (RunsPlans),
	// else nil.
	plans planPool
	// sums are the engine's checksums of the L2 pages its plans wrote,
	// carried on the Puts that spill them (sums.go).
	sums slabSums

	pool map[tiers.BatchID]*batch
	puts map[tiers.BatchID]*batch
	acks []tiers.Ack

	stats Stats

	// The store worker (storeops.go). jobs, nextJob, jobCtx, closed:
	// the owner goroutine only; jobQ, jobDone, jobRunning: under jobMu.
	jobs       map[uint64]*storeJob // issued, not yet drained
	nextJob    uint64
	jobCtx     context.Context
	jobCancel  context.CancelFunc
	closed     bool
	jobReady   chan struct{}
	jobWG      sync.WaitGroup
	jobMu      sync.Mutex
	jobQ       []*storeJob
	jobDone    []*storeJob
	jobSpare   []*storeJob
	jobRunning bool
	putJobs    int         // put jobs in jobs
	orphans    []tiers.Ack // store acks of batches not yet known
}

// New returns a Node over an opened stack and a Machine built from
// MachineOptions (the caller builds it, so tests can shape it).
func New(s *stack.Stack, m *control.Machine, opts Options) (*Node, error) {
	if s == nil || m == nil {
		return nil, fmt.Errorf("host: New needs a stack and a machine")
	}
	if s.Pool == nil {
		return nil, fmt.Errorf("host: the stack has no L1 pool")
	}
	st, err := pickStore(s, opts.Store)
	if err != nil {
		return nil, err
	}
	if m.Options().L3 && st == nil {
		return nil, fmt.Errorf("host: the machine runs L3 but the stack has no store")
	}
	if opts.Group == nil {
		opts.Group = Solo{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.SettleTimeout <= 0 {
		opts.SettleTimeout = 30 * time.Second
	}
	opts.Lanes = max(opts.Lanes, 1)
	if opts.StoreQueue <= 0 {
		opts.StoreQueue = defaultStoreQueue
	}
	if opts.Rank < 0 || opts.Rank >= opts.Lanes {
		return nil, fmt.Errorf("host: rank %d outside the %d owner lanes", opts.Rank, opts.Lanes)
	}
	lay := m.Options().L2
	if len(lay.Kinds) != len(s.Config.Payload.Kinds) {
		return nil, fmt.Errorf("host: the machine's L2 layout has %d kinds, the stack's payload %d", len(lay.Kinds), len(s.Config.Payload.Kinds))
	}
	n := &Node{
		m: m, s: s, store: st, group: opts.Group, engine: opts.Engine, facts: m, log: opts.Logger, opts: opts,
		layout: lay, kinds: len(lay.Kinds), sums: newSlabSums(lay),
		pool: map[tiers.BatchID]*batch{}, puts: map[tiers.BatchID]*batch{},
		stats:    Stats{Skips: map[string]int64{}, FailedOps: map[string]int64{}},
		jobs:     map[uint64]*storeJob{},
		jobReady: make(chan struct{}, 1),
	}
	n.plans, _ = s.Pool.(planPool)
	if sk, ok := st.(tiers.SumKeeper); ok {
		n.storeKeepsSums = sk.KeepsPutSums()
	}
	// NB: the worker's context is the Node's life, never a caller's: a
	// step's context ends with the step, long before its lookup runs.
	n.jobCtx, n.jobCancel = context.WithCancel(context.Background())
	return n, nil
}

// errMultiRank refuses an event or a tick on a local rank of a Multi.
var errMultiRank = errors.New("host: a local rank of a Multi: apply events and tick through the Multi")

// Machine returns the Node's Machine (for read-only views: MatchedL1,
// Stats, Digest).
func (n *Node) Machine() *control.Machine { return n.m }

// Stats returns a copy of the counters.
func (n *Node) Stats() Stats {
	s := n.stats
	s.Skips = clone(s.Skips)
	s.FailedOps = clone(s.FailedOps)
	return s
}

func clone(m map[string]int64) map[string]int64 {
	c := make(map[string]int64, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// Outstanding reports how many Pool and Store batches and store
// operations (lookups, gets, deletes, touches) are in flight.
func (n *Node) Outstanding() int { return len(n.pool) + len(n.puts) + len(n.jobs) }

// InFlight reports the batches in flight by tier: Pool copies (L1<->L2)
// and Store operations (put batches and the worker's lookups, gets,
// deletes and touches not yet drained).
func (n *Node) InFlight() (pool, store int) { return len(n.pool), len(n.puts) + len(n.jobs) }

// Apply hands one replicated engine event to the Machine and carries out
// what it asks; the returned Ready holds the Machine's answers (matches,
// placements, holds) for the driver. A refused event is the Machine's
// *control.EventError and changes nothing.
func (n *Node) Apply(ctx context.Context, e control.Event) (control.Ready, error) {
	if n.multi {
		return control.Ready{}, errMultiRank
	}
	if err := n.m.Apply(e); err != nil {
		return control.Ready{}, err
	}
	return n.run(ctx, e)
}

// run takes the Machine's Ready and carries it out.
func (n *Node) run(ctx context.Context, e control.Event) (control.Ready, error) {
	// The contribution is taken at the tick (Tick), not per event.
	rd := n.m.Output()
	n.m.Advance()
	for _, sk := range rd.Skips {
		n.stats.Skips[sk.Reason.String()]++
	}
	return rd, n.carry(ctx, e, rd)
}

// carry does this rank's part of rd, the Machine's output for event e
// (the zero Event for a tick): placements to the engine first (the
// backups of the same Ready read what it wrote), then copies, store ops.
func (n *Node) carry(ctx context.Context, e control.Event, rd control.Ready) error {
	if n.engine != nil {
		for _, p := range rd.Placements {
			var hs []pagehash.Hash
			if p.Req == e.Req && (e.Kind == control.EvInsert || e.Kind == control.EvExtend) {
				pages := 0
				for _, r := range p.L1 {
					pages += int(r.Pages)
				}
				if pages <= len(e.Hashes) {
					hs = e.Hashes[len(e.Hashes)-pages:]
				}
			}
			if err := n.engine.Place(p, hs); err != nil {
				return fmt.Errorf("host: engine place req %d node %d: %w", p.Req, p.Node, err)
			}
		}
	}
	if err := n.copies(ctx, rd.Copies); err != nil {
		return err
	}
	for _, p := range rd.Puts {
		n.put(p)
	}
	for _, l := range rd.Lookups {
		n.lookup(l)
	}
	for _, g := range rd.Gets {
		n.get(g)
	}
	for _, d := range rd.Deletes {
		if ks := n.keys(d.Hashes, d.Depth); n.store != nil && len(ks) > 0 {
			if j := (&storeJob{kind: jobDelete, op: d.Op, keys: ks}); !n.enqueue(j) {
				n.log.Warn("kvtier host: delete after a failed spill dropped", "op", uint64(d.Op), "err", ErrStoreQueueFull)
			}
		}
	}
	for _, t := range rd.Touches {
		if ks := n.keys(t.Hashes, t.Depth); n.store != nil && len(ks) > 0 {
			if j := (&storeJob{kind: jobTouch, keys: ks}); !n.enqueue(j) {
				n.log.Debug("kvtier host: touch dropped", "err", ErrStoreQueueFull)
			}
		}
	}
	return nil
}

// owns reports whether the page at position i of its key is this Node's.
func (n *Node) owns(i int) bool { return control.OwnerOf(i, n.opts.Lanes) == n.opts.Rank }

// keys returns the store keys, every kind, of the pages of hs this Node
// owns (hs[0] is at position depth of its key).
func (n *Node) keys(hs []pagehash.Hash, depth int) []tiers.Key {
	ks := make([]tiers.Key, 0, len(hs)*n.kinds)
	for k := range n.kinds {
		for j, h := range hs {
			if n.owns(depth + j) {
				ks = append(ks, tiers.Key{Hash: h, Kind: tiers.PayloadKind(k)})
			}
		}
	}
	return ks
}

// copies issues one Pool batch per op and direction.
func (n *Node) copies(ctx context.Context, cs []control.Copy) error {
	for i := 0; i < len(cs); {
		j := i
		// NB: sized once for the op's pages this Node copies (every kind):
		// a step copies a page a kind and rank. A copy's pages sit at
		// consecutive positions and one in every lanes of them is this
		// Node's (control.OwnerOf), so its share is at most a ceiling
		// division, counted over the runs instead of page by page.
		lanes := max(n.opts.Lanes, 1)
		total := 0
		for k := i; k < len(cs) && cs[k].Op == cs[i].Op; k++ {
			pages := 0
			for _, r := range cs[k].L1 {
				pages += int(r.Pages)
			}
			total += (pages + lanes - 1) / lanes
		}
		total *= n.kinds
		items := make([]tiers.PoolCopy, 0, total)
		sizes := make([]int64, 0, total)
		var pages []slabPage
		if cs[i].Dir == control.ToL2 {
			pages = make([]slabPage, 0, total)
		}
		bad := false
		for ; j < len(cs) && cs[j].Op == cs[i].Op; j++ {
			var err error
			if items, sizes, pages, err = n.copyItems(cs[j], items, sizes, pages); err != nil {
				// A Copy the layout cannot express is a bug upstream:
				// fail the op rather than hang on it.
				n.log.Error("kvtier host: bad copy", "op", uint64(cs[j].Op), "err", err)
				bad = true
				break
			}
		}
		op, dir := cs[i].Op, cs[i].Dir
		for ; j < len(cs) && cs[j].Op == op; j++ {
		}
		i = j
		if bad {
			n.fail(op, "copy", control.StageCopied)
			continue
		}
		if len(items) == 0 {
			// None of the op's pages is this lane's: done, in lockstep.
			n.done(op, control.StageCopied, true)
			continue
		}
		var id tiers.BatchID
		var err error
		if dir == control.ToL2 {
			// The pages are rewritten: a sum of their last bytes is no
			// longer theirs, whatever this copy's fate.
			for _, pg := range pages {
				n.sums.forget(pg)
			}
			id, err = n.s.Pool.CopyToSlab(ctx, items)
		} else {
			id, err = n.s.Pool.CopyFromSlab(ctx, items)
		}
		if err != nil || id == 0 {
			if err != nil {
				n.log.Warn("kvtier host: pool copy refused", "op", uint64(op), "dir", dir.String(), "err", err)
			}
			n.done(op, control.StageCopied, err == nil)
			continue
		}
		n.pool[id] = &batch{op: op, kind: "copy", dir: dir, bytes: sizes, pages: pages, state: make([]uint8, len(items))}
	}
	return nil
}

// copyItems turns one Copy into pool items: page i of the node's L1
// ranges moves to or from page i of each kind's L2 ranges, for the pages
// this Node owns. For a backup (into L2), pages gets each item's L2 page:
// where the sum a pool's ack or the engine's completion carries goes.
func (n *Node) copyItems(c control.Copy, items []tiers.PoolCopy, sizes []int64, pages []slabPage) ([]tiers.PoolCopy, []int64, []slabPage, error) {
	named := c.Dir == control.ToL2
	// NB: the L1 pages in order, in a scratch array the Node reuses (only
	// this call reads it).
	l1 := n.l1Pages[:0]
	for _, r := range c.L1 {
		for p := r.Start; p < r.Start+r.Pages; p++ {
			l1 = append(l1, p)
		}
	}
	n.l1Pages = l1
	for k := range n.kinds {
		pb := n.layout.Kinds[k].PageBytes
		i := 0
		for _, r := range c.L2 {
			if int(r.Kind) != k {
				continue
			}
			sp, err := n.layout.Span(tiers.PayloadKind(k), r)
			if err != nil {
				return nil, nil, nil, err
			}
			for off := int64(0); off < sp.Length; off += pb {
				if i >= len(l1) {
					return nil, nil, nil, fmt.Errorf("node %d kind %d: more L2 pages than the %d L1 pages", c.Node, k, len(l1))
				}
				if n.owns(c.Depth + i) {
					items = append(items, tiers.PoolCopy{Page: int(l1[i]), Kind: tiers.PayloadKind(k), Span: tiers.Span{Slab: sp.Slab, Offset: sp.Offset + off, Length: pb}})
					sizes = append(sizes, pb)
					if named {
						pages = append(pages, slabPage{kind: tiers.PayloadKind(k), page: r.Start + off/pb})
					}
				}
				i++
			}
		}
		if i != len(l1) {
			return nil, nil, nil, fmt.Errorf("node %d kind %d: %d L2 pages for %d L1 pages", c.Node, k, i, len(l1))
		}
	}
	return items, sizes, pages, nil
}

func (n *Node) put(p control.Put) {
	if n.store == nil || len(p.Spans) != len(p.Hashes)*n.kinds {
		n.fail(p.Op, "put", control.StageGathered, control.StageDurable)
		return
	}
	reqs := make([]tiers.PutRequest, 0, len(p.Spans))
	sizes := make([]int64, 0, len(p.Spans))
	for i, sp := range p.Spans {
		if pg := i % len(p.Hashes); n.owns(p.Depth + pg) {
			kind := tiers.PayloadKind(i / len(p.Hashes))
			req := tiers.PutRequest{Key: tiers.Key{Hash: p.Hashes[pg], Kind: kind}, Src: sp}
			// The engine's sum of the bytes it wrote travels with the
			// page: a store that keeps it never vouches for bytes that
			// changed in the slab since.
			req.Sum, req.HasSum = n.sums.spanSum(kind, sp)
			reqs = append(reqs, req)
			sizes = append(sizes, sp.Length)
		}
	}
	if len(reqs) == 0 {
		// None of the spill's pages is this lane's: gathered and durable
		// here at once; the frontier waits for the owners.
		n.done(p.Op, control.StageGathered, true)
		n.done(p.Op, control.StageDurable, true)
		return
	}
	// NB: Put is asynchronous by contract, but a plugin's or a remote
	// store's call can still block: the worker makes it, in order with
	// the deletes (a delete after a failed spill never overtakes a later
	// put of the same page). Drain registers the batch; its acks wait
	// for that (Drain keeps them).
	j := &storeJob{kind: jobPut, op: p.Op, puts: reqs, sizes: sizes}
	if !n.enqueue(j) {
		n.refuse(j, ErrStoreQueueFull)
	}
}

// lookup answers a Lookup from this Node's own pages: with pos the
// positions in l.Hashes of the pages it owns, the store's longest prefix
// of those pages, k, leaves the pages before pos[k] (the first of its own
// that is missing) covered as far as this lane can tell; the group's MIN
// over the lanes is then the longest prefix durable on every owner. The
// store is asked by the worker; Drain records the answer (Longest).
func (n *Node) lookup(l control.Lookup) {
	c := 0
	if n.store != nil && len(l.Hashes) > 0 {
		c = len(l.Hashes)
		hs, pos := l.Hashes, []int(nil)
		if n.opts.Lanes > 1 {
			hs = nil
			for j, h := range l.Hashes {
				if n.owns(l.Depth + j) {
					hs, pos = append(hs, h), append(pos, j)
				}
			}
			// NB: the sentinel: every own page present covers the suffix.
			pos = append(pos, len(l.Hashes))
		}
		if len(hs) > 0 {
			j := &storeJob{kind: jobLookup, op: l.Op, hashes: hs, pos: pos, total: len(l.Hashes)}
			if !n.enqueue(j) {
				n.refuse(j, ErrStoreQueueFull)
			}
			return
		}
	}
	if err := n.facts.Longest(l.Op, c); err != nil {
		n.log.Error("kvtier host: longest", "op", uint64(l.Op), "err", err)
	}
}

// get reloads a Get's own pages into its slab spans through the worker;
// Drain records the outcome (Done(loaded)). The spans stay reserved by
// the Machine until then.
func (n *Node) get(g control.Get) {
	if n.store == nil || len(g.Spans) != len(g.Hashes)*n.kinds {
		n.stats.FailedOps["get"]++
		n.done(g.Op, control.StageLoaded, false)
		return
	}
	reqs := make([]tiers.GetRequest, 0, len(g.Spans))
	for i, sp := range g.Spans {
		if pg := i % len(g.Hashes); n.owns(g.Depth + pg) {
			kind := tiers.PayloadKind(i / len(g.Hashes))
			// The reload rewrites the page: an engine's sum of its
			// last bytes is no longer its own.
			n.sums.forgetSpan(kind, sp)
			reqs = append(reqs, tiers.GetRequest{Key: tiers.Key{Hash: g.Hashes[pg], Kind: kind}, Dst: sp})
		}
	}
	if len(reqs) == 0 {
		// None of the reload's pages is this lane's.
		n.done(g.Op, control.StageLoaded, true)
		return
	}
	j := &storeJob{kind: jobGet, op: g.Op, gets: reqs}
	if !n.enqueue(j) {
		n.refuse(j, ErrStoreQueueFull)
	}
}

func (n *Node) fail(op control.OpID, kind string, stages ...control.Stage) {
	n.stats.FailedOps[kind]++
	for _, st := range stages {
		n.done(op, st, false)
	}
}

func (n *Node) done(op control.OpID, st control.Stage, ok bool) {
	if err := n.facts.Done(op, st, ok); err != nil {
		n.log.Error("kvtier host: done", "op", uint64(op), "stage", st.String(), "err", err)
	}
}

// Drain feeds every queued Pool and Store ack and every finished store
// operation (lookup, get) to the Machine without blocking.
func (n *Node) Drain() {
	n.drainJobs()
	n.acks = n.s.Pool.DrainAcks(n.acks[:0])
	for _, a := range n.acks {
		b := n.pool[a.Batch]
		if b == nil || a.Index < 0 || a.Index >= len(b.state) || b.state[a.Index] == 2 {
			continue
		}
		b.state[a.Index] = 2
		b.terminal++
		if a.Stage == tiers.AckCopied {
			b.okBytes += b.bytes[a.Index]
			if a.HasSum && b.dir == control.ToL2 && a.Index < len(b.pages) {
				n.sums.set(b.pages[a.Index], a.Sum)
			}
		} else {
			b.failed = true
		}
		if b.terminal == len(b.state) {
			delete(n.pool, a.Batch)
			if b.failed {
				n.stats.FailedOps["copy"]++
			} else if b.dir == control.ToL2 {
				n.stats.L1ToL2 += b.okBytes
			} else {
				n.stats.L2ToL1 += b.okBytes
			}
			n.done(b.op, control.StageCopied, !b.failed)
		}
	}
	if n.store == nil {
		return
	}
	// An ack may come before Drain took its Put's result (the worker
	// learns the batch id when Put returns): kept while a put job is out,
	// fed once the batch is known; an abandoned batch's acks are dropped.
	n.acks = n.store.DrainAcks(append(n.acks[:0], n.orphans...))
	n.orphans = n.orphans[:0]
	for _, a := range n.acks {
		b := n.puts[a.Batch]
		if b == nil {
			if n.putJobs > 0 && len(n.orphans) < maxOrphanAcks {
				n.orphans = append(n.orphans, a)
			}
			continue
		}
		if a.Index < 0 || a.Index >= len(b.state) || b.state[a.Index] == 2 {
			continue
		}
		n.putAck(a, b)
	}
}

// maxOrphanAcks bounds the store acks kept for batches Drain does not know
// yet.
const maxOrphanAcks = 1 << 16

func (n *Node) putAck(a tiers.Ack, b *batch) {
	first := b.state[a.Index] == 0
	switch a.Stage {
	case tiers.AckGathered:
		if !first {
			return
		}
		b.state[a.Index] = 1
		b.gathered++
		n.checkGathered(b, a.Index)
	case tiers.AckDurable, tiers.AckFailed:
		if first {
			b.gathered++
			if a.Stage == tiers.AckFailed {
				b.gFailed = true
			} else {
				n.checkGathered(b, a.Index)
			}
		}
		b.state[a.Index] = 2
		b.terminal++
		if a.Stage == tiers.AckFailed || (b.sums != nil && b.sums[a.Index].bad) {
			b.failed = true
		} else {
			b.okBytes += b.bytes[a.Index]
		}
	default:
		return
	}
	if first && b.gathered == len(b.state) {
		n.done(b.op, control.StageGathered, !b.gFailed)
	}
	if b.terminal == len(b.state) {
		delete(n.puts, a.Batch)
		if b.failed {
			n.stats.FailedOps["put"]++
		} else {
			n.stats.L2ToL3 += b.okBytes
		}
		n.done(b.op, control.StageDurable, !b.failed)
	}
}

// checkGathered checks put item i of b, just gathered by a store that
// keeps no sums, against the engine's sum: a page that changed in the
// slab since the engine wrote it fails the spill (the Machine rolls it
// back and deletes the store's copy, which it computed its own checksum
// over), so the store never keeps it as valid. A Node reads the page
// once for this, on the goroutine that drains; a SumKeeper store needs
// no check (a changed page is a miss at its every read).
func (n *Node) checkGathered(b *batch, i int) {
	if b.sums == nil || !b.sums[i].has {
		return
	}
	ps := &b.sums[i]
	src, err := n.s.Slab.Bytes(ps.span)
	if err == nil && crc32c.Checksum(src) == ps.sum {
		return
	}
	ps.bad = true
	b.gFailed = true
	n.stats.SumFailures++
	n.log.Error("kvtier host: a page changed in the slab after the engine wrote it, before the store gathered it: the spill fails", "op", uint64(b.op), "item", i, "err", err)
}

// Settle drains acks and store results until no batch and no store
// operation is in flight, waiting on the tiers' AckReady and StoreReady.
// What is still outstanding after SettleTimeout is failed (the ops roll
// back or miss) and forgotten; late acks and results are ignored. A
// deterministic driver (a replay) settles before each tick, so every
// answer is in before the frontier.
func (n *Node) Settle(ctx context.Context) error {
	deadline := time.NewTimer(n.opts.SettleTimeout)
	defer deadline.Stop()
	var storeReady <-chan struct{}
	if n.store != nil {
		storeReady = n.store.AckReady()
	}
	for {
		n.Drain()
		if n.Outstanding() == 0 {
			return nil
		}
		select {
		case <-n.s.Pool.AckReady():
		case <-storeReady:
		case <-n.jobReady:
		case <-ctx.Done():
			n.abandon("canceled")
			return ctx.Err()
		case <-deadline.C:
			n.abandon("timeout")
			return nil
		}
	}
}

// abandon fails every outstanding batch's and store operation's op.
func (n *Node) abandon(why string) {
	n.abandonJobs(why)
	for id, b := range n.pool {
		n.log.Warn("kvtier host: pool batch abandoned", "op", uint64(b.op), "why", why)
		delete(n.pool, id)
		n.stats.FailedOps["timeout"]++
		n.done(b.op, control.StageCopied, false)
	}
	for id, b := range n.puts {
		n.log.Warn("kvtier host: put batch abandoned", "op", uint64(b.op), "why", why)
		delete(n.puts, id)
		n.stats.FailedOps["timeout"]++
		if b.gathered < len(b.state) {
			n.done(b.op, control.StageGathered, false)
		}
		n.done(b.op, control.StageDurable, false)
	}
}

// Tick drains the acks, exchanges the contribution with the group, ticks
// the Machine with the frontier and carries out what the tick asks. The
// returned Ready holds the tick's answers (unholds, skips).
func (n *Node) Tick(ctx context.Context) (control.Ready, error) {
	if n.multi {
		return control.Ready{}, errMultiRank
	}
	n.Drain()
	c := n.m.Contribution()
	f, err := n.group.Exchange(ctx, n.m.Ticks(), c)
	if err != nil {
		return control.Ready{}, fmt.Errorf("host: exchange at tick %d: %w", n.m.Ticks(), err)
	}
	if err := n.m.Tick(f); err != nil {
		return control.Ready{}, fmt.Errorf("host: tick %d: %w", n.m.Ticks(), err)
	}
	n.stats.Ticks++
	return n.run(ctx, control.Event{})
}

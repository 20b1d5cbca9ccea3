package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"slices"
	"sync"
	"time"

	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/host/placement"
	"github.com/kvtier/kvtier/host/stack"
)

// This file is one control Machine for the ranks a node hosts together.
//
// The ranks of one engine on one node run identical Machines by design:
// each rank's Machine takes the same events and the same frontier, and
// decides the same. A Multi runs that Machine once and carries each of its
// decisions out on every local rank's own tiers (its L1 pool, its slab,
// its store), each rank moving its own pages (owner lanes) or every page
// (replicas), exactly as that rank's own Node would. What each rank
// finishes is a local fact of that rank; the Multi reduces the local
// ranks' facts before the Machine sees them, with the frontier's own
// rules (an op is done when every local rank finished it, ok when every
// one succeeded, a lookup's value the MIN of theirs), so the contribution
// the Machine offers its group is the reduction of the contributions the
// local ranks' Machines would have offered: MIN and AND are associative,
// and the frontier over the nodes equals the frontier over all ranks. The
// group exchange is then needed only between nodes.

// facts takes a rank's local facts about its ops: the Machine itself for
// a Node of its own, the Multi's reduction for a rank of a Multi.
type facts interface {
	Done(id control.OpID, stage control.Stage, ok bool) error
	Longest(id control.OpID, pages int) error
}

// MaxLocalRanks bounds the ranks one Multi carries (a bit each while it
// reduces their facts).
const MaxLocalRanks = 64

// Local is one rank a Multi carries the Machine's decisions out for.
type Local struct {
	// Stack is the rank's own opened tiers. Every local rank's stack has
	// the geometry the Machine was built for (MachineOptions of each
	// gives the same L1 pages and L2 layout).
	Stack *stack.Stack
	// Rank is the rank's owner lane when Options.Lanes > 1.
	Rank int
	// Engine writes the rank's placed pages (nil: nothing is written).
	Engine Engine
}

// Multi runs one control Machine for several ranks hosted together and
// carries its decisions out on each rank's tiers (see the file comment).
// Like a Node, it is not safe for concurrent use: one goroutine owns it.
type Multi struct {
	m     *control.Machine
	group Group
	log   *slog.Logger
	opts  Options
	ranks []*Node

	// pend reduces the local ranks' facts of an op stage until every rank
	// has reported it.
	pend map[factKey]factSum

	skips map[string]int64
	ticks uint64
}

type factKey struct {
	op    control.OpID
	stage control.Stage
}

// factSum is the reduction so far of one op stage's local facts.
type factSum struct {
	seen  uint64 // a bit per local rank that reported
	ok    bool
	value int
}

// rankFacts is local rank i's view of the Multi's reduction.
type rankFacts struct {
	m *Multi
	i int
}

func (f rankFacts) Done(id control.OpID, stage control.Stage, ok bool) error {
	return f.m.report(f.i, factKey{id, stage}, ok, 0)
}

func (f rankFacts) Longest(id control.OpID, pages int) error {
	return f.m.report(f.i, factKey{id, control.StageFound}, true, pages)
}

// errTwice marks a local rank that reported one op stage twice.
var errTwice = errors.New("reported twice")

// report folds local rank i's fact about k into the reduction and hands
// the reduced fact to the Machine once every local rank has reported.
func (mu *Multi) report(i int, k factKey, ok bool, value int) error {
	s, had := mu.pend[k]
	if !had {
		s = factSum{ok: true, value: value}
	}
	bit := uint64(1) << i
	if s.seen&bit != 0 {
		return fmt.Errorf("host: local rank %d: op %d stage %s: %w", i, k.op, k.stage, errTwice)
	}
	s.seen |= bit
	s.ok = s.ok && ok
	s.value = min(s.value, value)
	if bits.OnesCount64(s.seen) < len(mu.ranks) {
		mu.pend[k] = s
		return nil
	}
	delete(mu.pend, k)
	if k.stage == control.StageFound {
		return mu.m.Longest(k.op, s.value)
	}
	return mu.m.Done(k.op, k.stage, s.ok)
}

// NewMulti returns a Multi that runs m for the local ranks. opts applies
// to every rank (Group is the Multi's group: the other nodes; nil: Solo);
// its Rank and Engine are ignored for each Local's own.
func NewMulti(m *control.Machine, locals []Local, opts Options) (*Multi, error) {
	if m == nil {
		return nil, fmt.Errorf("host: NewMulti needs a machine")
	}
	if len(locals) < 1 || len(locals) > MaxLocalRanks {
		return nil, fmt.Errorf("host: %d local ranks, want 1..%d", len(locals), MaxLocalRanks)
	}
	if opts.Group == nil {
		opts.Group = Solo{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	mu := &Multi{
		m: m, group: opts.Group, log: opts.Logger, opts: opts,
		pend: map[factKey]factSum{}, skips: map[string]int64{},
	}
	mo := m.Options()
	for i, l := range locals {
		if err := sameGeometry(l.Stack, mo, opts.Store); err != nil {
			mu.closeRanks()
			return nil, fmt.Errorf("host: local rank %d: %w", i, err)
		}
		o := opts
		o.Group, o.Rank, o.Engine = nil, l.Rank, l.Engine
		o.Logger = opts.Logger.With("local", i)
		n, err := New(l.Stack, m, o)
		if err != nil {
			mu.closeRanks()
			return nil, fmt.Errorf("host: local rank %d: %w", i, err)
		}
		n.facts, n.multi = rankFacts{mu, i}, true
		mu.ranks = append(mu.ranks, n)
	}
	return mu, nil
}

// sameGeometry checks that s has the geometry of the Machine's options.
func sameGeometry(s *stack.Stack, mo control.Options, store string) error {
	o, err := MachineOptions(s, control.Options{}, store)
	if err != nil {
		return err
	}
	if o.L1Pages != mo.L1Pages {
		return fmt.Errorf("L1 of %d pages, the machine's %d", o.L1Pages, mo.L1Pages)
	}
	if o.L3 != mo.L3 {
		return fmt.Errorf("store below the slab %v, the machine's L3 %v", o.L3, mo.L3)
	}
	if !sameLayout(o.L2, mo.L2) {
		return fmt.Errorf("L2 layout %s, the machine's %s", o.L2, mo.L2)
	}
	return nil
}

func sameLayout(a, b placement.Layout) bool {
	return slices.EqualFunc(a.Kinds, b.Kinds, func(x, y placement.KindLayout) bool {
		return x.Name == y.Name && x.PageBytes == y.PageBytes && slices.Equal(x.Regions, y.Regions)
	})
}

// forward passes every value of each rank's pool, store and store worker
// channels on to ready until stop closes, and returns a wait for its
// goroutines. The sources are buffered and read by no one else, so a
// value sent before forward starts is still forwarded.
func (mu *Multi) forward(ready chan<- struct{}, stop <-chan struct{}) func() {
	var wg sync.WaitGroup
	pass := func(src <-chan struct{}) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-src:
					select {
					case ready <- struct{}{}:
					default:
					}
				case <-stop:
					return
				}
			}
		}()
	}
	for _, n := range mu.ranks {
		pass(n.s.Pool.AckReady())
		if n.store != nil {
			pass(n.store.AckReady())
		}
		pass(n.jobReady)
	}
	return wg.Wait
}

// Machine returns the Multi's Machine (for read-only views).
func (mu *Multi) Machine() *control.Machine { return mu.m }

// Ranks returns the number of local ranks.
func (mu *Multi) Ranks() int { return len(mu.ranks) }

// Rank returns local rank i's Node, for what is the rank's own: its
// engine's plans (TakePlans, CompletePlan, FailPlans), its stats, its
// tiers. Events and ticks go through the Multi; the rank's Node refuses
// them.
func (mu *Multi) Rank(i int) *Node { return mu.ranks[i] }

// Apply hands one replicated engine event to the Machine and carries out
// what it asks on every local rank (Node.Apply).
func (mu *Multi) Apply(ctx context.Context, e control.Event) (control.Ready, error) {
	if err := mu.m.Apply(e); err != nil {
		return control.Ready{}, err
	}
	return mu.run(ctx, e)
}

func (mu *Multi) run(ctx context.Context, e control.Event) (control.Ready, error) {
	rd := mu.m.Output()
	mu.m.Advance()
	for _, sk := range rd.Skips {
		mu.skips[sk.Reason.String()]++
	}
	for i, n := range mu.ranks {
		if err := n.carry(ctx, e, rd); err != nil {
			return rd, fmt.Errorf("local rank %d: %w", i, err)
		}
	}
	return rd, nil
}

// Drain feeds every local rank's acks and store results to the reduction
// without blocking.
func (mu *Multi) Drain() {
	for _, n := range mu.ranks {
		n.Drain()
	}
}

// Tick drains, exchanges the reduced contribution with the group (the
// other nodes), ticks the Machine with the frontier and carries out what
// the tick asks on every local rank.
func (mu *Multi) Tick(ctx context.Context) (control.Ready, error) {
	mu.Drain()
	c := mu.m.Contribution()
	f, err := mu.group.Exchange(ctx, mu.m.Ticks(), c)
	if err != nil {
		return control.Ready{}, fmt.Errorf("host: exchange at tick %d: %w", mu.m.Ticks(), err)
	}
	if err := mu.m.Tick(f); err != nil {
		return control.Ready{}, fmt.Errorf("host: tick %d: %w", mu.m.Ticks(), err)
	}
	mu.ticks++
	return mu.run(ctx, control.Event{})
}

// Outstanding sums the local ranks' batches and store operations in
// flight.
func (mu *Multi) Outstanding() int {
	t := 0
	for _, n := range mu.ranks {
		t += n.Outstanding()
	}
	return t
}

// Settle drains until no local rank has anything in flight (Node.Settle);
// what is still outstanding after SettleTimeout is failed on every rank.
func (mu *Multi) Settle(ctx context.Context) error {
	timeout := mu.opts.SettleTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	// NB: the forwarders run only while Settle waits: between calls a
	// driver drains at its own pace, and no goroutine wakes per ack.
	ready, stop := make(chan struct{}, 1), make(chan struct{})
	wait := mu.forward(ready, stop)
	defer func() {
		close(stop)
		wait()
	}()
	for {
		mu.Drain()
		if mu.Outstanding() == 0 {
			return nil
		}
		select {
		case <-ready:
		case <-ctx.Done():
			for _, n := range mu.ranks {
				n.abandon("canceled")
			}
			return ctx.Err()
		case <-deadline.C:
			for _, n := range mu.ranks {
				n.abandon("timeout")
			}
			return nil
		}
	}
}

// RankStats returns local rank i's counters (its bytes and failed ops)
// with the Machine's skips and ticks, as a Node of its own would count
// them.
func (mu *Multi) RankStats(i int) Stats {
	s := mu.ranks[i].Stats()
	s.Skips, s.Ticks = clone(mu.skips), mu.ticks
	return s
}

// Stats sums the local ranks' counters; the skips and ticks are the
// Machine's, counted once.
func (mu *Multi) Stats() Stats {
	s := Stats{Skips: clone(mu.skips), FailedOps: map[string]int64{}, Ticks: mu.ticks}
	for _, n := range mu.ranks {
		st := &n.stats
		s.L1ToL2 += st.L1ToL2
		s.L2ToL3 += st.L2ToL3
		s.L3ToL2 += st.L3ToL2
		s.L2ToL1 += st.L2ToL1
		s.SumFailures += st.SumFailures
		for k, v := range st.FailedOps {
			s.FailedOps[k] += v
		}
	}
	return s
}

// Close closes every local rank's Node (Node.Close). Call it from the
// owner goroutine.
func (mu *Multi) Close() error { return mu.closeRanks() }

func (mu *Multi) closeRanks() error {
	var errs []error
	for i, n := range mu.ranks {
		if err := n.Close(); err != nil {
			errs = append(errs, fmt.Errorf("local rank %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

package replay

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/kvtier/kvtier/host/radix"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/belady"
)

// Spec names one policy to replay and its parameters.
type Spec struct {
	// Name is the registered policy name.
	Name string
	// Params are the policy's parameters (policy.Options.Params).
	Params map[string]float64
}

// Plan is a set of replays of one trace: every policy at every finite
// capacity, the Belady bound at each finite capacity, and the infinite
// bound once.
type Plan struct {
	// Policies are the online policies, first the primary one.
	Policies []Spec
	// Capacities are in tokens; 0 stands for infinite, which is the
	// infinite row (every policy is equal there) and is not repeated.
	Capacities []int64
	// Belady adds the belady row per finite capacity.
	Belady bool
	// Infinite adds the infinite-capacity row.
	Infinite bool
	// Parallel is how many replays run at once (one tree replica each);
	// 0 means GOMAXPROCS.
	Parallel int
	// Breakdown classifies misses (slightly slower).
	Breakdown bool
	// Lookahead is the engine's waiting queue as an eviction hint: while
	// request i is replayed, the pages of requests i+1..i+Lookahead that
	// were present when each entered the window are locked against
	// eviction (see waitingQueue for exactly what is protected). 0 is the
	// plain replay, bit for bit; the infinite row evicts nothing and is
	// the same at every lookahead.
	Lookahead int
	// Progress, if set, is called from the replaying goroutines with
	// counts of requests replayed; it must be safe for concurrent use.
	Progress func(int)
}

// job is one replay of a plan.
type job struct {
	spec     Spec
	capacity int64
}

// Jobs returns the number of replays the plan makes.
func (p Plan) Jobs() int { return len(p.jobs()) }

// jobs lists the replays in output order: per finite capacity, each policy
// then belady; the infinite row last.
func (p Plan) jobs() []job {
	var out []job
	for _, c := range p.Capacities {
		if c == 0 {
			continue
		}
		for _, s := range p.Policies {
			out = append(out, job{s, c})
		}
		if p.Belady {
			out = append(out, job{Spec{Name: belady.Name}, c})
		}
	}
	if p.Infinite {
		out = append(out, job{Spec{Name: Infinite}, 0})
	}
	return out
}

// NewEvictor builds the named policy from reg for a replay of tr. Online
// policies get no future; a policy that refuses to build without one (an
// offline oracle such as belady) is built again with tr as its Future.
func NewEvictor(reg *policy.Registry, tr *Trace, s Spec) (policy.Evictor, error) {
	if s.Name == Infinite {
		return unbounded{}, nil
	}
	r, err := reg.Lookup(policy.EvictorV1, s.Name)
	if err != nil {
		return nil, fmt.Errorf("replay: policy %q: %w", s.Name, err)
	}
	ev, err := r.Factory(policy.Options{Params: s.Params})
	if errors.Is(err, belady.ErrOffline) {
		ev, err = r.Factory(policy.Options{Params: s.Params, Future: tr})
		if err == nil {
			// NB: an oracle ranks a leaf by its tail's next use, which a
			// trim changes: the tree must free its victims page by page
			// to stay the block-level oracle.
			ev = tailRanked{ev}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("replay: policy %q: %w", s.Name, err)
	}
	return ev, nil
}

// tailRanked marks an offline oracle as ranking leaves by their tail page
// (radix.TailRanker).
type tailRanked struct{ policy.Evictor }

func (tailRanked) TailRanked() bool { return true }

// Check forwards the oracle's own invariant check (radix.SelfChecker).
func (t tailRanked) Check() string {
	if c, ok := t.Evictor.(radix.SelfChecker); ok {
		return c.Check()
	}
	return ""
}

// RunPlan runs every replay of p on tr, in parallel, each on its own tree
// replica and evictor, and returns the results in the plan's order. The
// results do not depend on Parallel. Cancelling ctx stops every replay
// within a few hundred requests and returns ctx's error.
func RunPlan(ctx context.Context, tr *Trace, reg *policy.Registry, p Plan) ([]Result, error) {
	if p.Lookahead < 0 {
		return nil, fmt.Errorf("replay %s: lookahead %d is negative", tr.Name, p.Lookahead)
	}
	jobs := p.jobs()
	evs := make([]policy.Evictor, len(jobs))
	for i, j := range jobs {
		ev, err := NewEvictor(reg, tr, j.spec)
		if err != nil {
			return nil, err
		}
		evs[i] = ev
	}
	par := p.Parallel
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	results := make([]Result, len(jobs))
	errs := make([]error, len(jobs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(par, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				results[i], errs[i] = runOne(ctx, tr, evs[i], jobs[i].capacity, p.Lookahead, p.Breakdown, p.Progress)
			}
		}()
	}
	for i := range jobs {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return results, fmt.Errorf("replay %s: %w", tr.Name, err)
	}
	if err := errors.Join(errs...); err != nil {
		return results, err
	}
	return results, nil
}

func runOne(ctx context.Context, tr *Trace, ev policy.Evictor, capacity int64, lookahead int, breakdown bool, progress func(int)) (Result, error) {
	if lookahead < 0 {
		return Result{}, fmt.Errorf("replay %s: lookahead %d is negative", tr.Name, lookahead)
	}
	r, err := newRunner(tr, ev, capacity, breakdown)
	if err != nil {
		return Result{}, err
	}
	r.res.Lookahead = lookahead
	// NB: with no capacity nothing is evicted, so protection would change
	// nothing; the infinite row skips its cost.
	if lookahead > 0 && capacity > 0 {
		// NB: a window longer than the trace is the whole rest of it.
		r.queue = newWaitingQueue(min(lookahead, tr.Requests()))
		// Before request 0 the window holds requests 1..lookahead-1;
		// request 0 adds request lookahead.
		for j := 1; j < r.queue.n; j++ {
			if err := r.queue.enter(r, j); err != nil {
				return r.finish(), fmt.Errorf("replay %s: %w", tr.Name, err)
			}
		}
	}
	const every = 128
	for i := range tr.Requests() {
		if err := r.request(i); err != nil {
			return r.finish(), fmt.Errorf("policy %s at %d tokens: %w", ev.Name(), capacity, err)
		}
		if (i+1)%every == 0 {
			if ctx.Err() != nil {
				return r.finish(), ctx.Err()
			}
			if progress != nil {
				progress(every)
			}
		}
	}
	if progress != nil {
		progress(tr.Requests() % every)
	}
	return r.finish(), nil
}

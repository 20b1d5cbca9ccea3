package replay

import (
	"github.com/kvtier/kvtier/internal/measure"

	"container/list"
	"fmt"
	"runtime"
	"time"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/workload"
)

// BenchConfig configures Bench.
type BenchConfig struct {
	// Policy is the evictor of the host path (default lru).
	Policy Spec
	// CapacityTokens is the replay capacity (default 3M tokens).
	CapacityTokens int64
	// Rounds is how many timed rounds each side gets; the median counts
	// (default 5).
	Rounds int
	// MinRound is the least time one round replays for (default 200ms).
	MinRound time.Duration
	// OneCore pins the run to one P (GOMAXPROCS=1) while it lasts.
	OneCore bool
}

func (c *BenchConfig) defaults() {
	if c.Policy.Name == "" {
		c.Policy.Name = "lru"
	}
	if c.CapacityTokens == 0 {
		c.CapacityTokens = 3_000_000
	}
	if c.Rounds <= 0 {
		c.Rounds = 5
	}
	if c.MinRound <= 0 {
		c.MinRound = 200 * time.Millisecond
	}
}

// BenchResult is what Bench measured.
type BenchResult struct {
	// Trace is the replayed trace's name.
	Trace string
	// Policy and CapacityTokens are the host path's settings.
	Policy         string
	CapacityTokens int64
	// BlockOps is the number of blocks one replay processes (each block
	// is one op: a lookup that hits, or a lookup, possibly an eviction,
	// and an insert).
	BlockOps int
	// HostOpsPerSec is the median rate of the host path — radix tree +
	// policy + logical clock, locks and evictions, invariants off — in
	// block-ops per CPU-second of the process.
	HostOpsPerSec float64
	// NaiveOpsPerSec is the median rate of the naive map + list LRU over
	// the same blocks and capacity.
	NaiveOpsPerSec float64
	// HostHitRate and NaiveHitRate are the two replays' token hit rates
	// (the naive LRU is block-level without the leaf-only constraint, so
	// they differ; they are printed to show both did the work).
	HostHitRate  float64
	NaiveHitRate float64
	// Rounds is the number of timed rounds per side.
	Rounds int
}

// Ratio returns HostOpsPerSec / NaiveOpsPerSec.
func (r BenchResult) Ratio() float64 {
	if r.NaiveOpsPerSec == 0 {
		return 0
	}
	return r.HostOpsPerSec / r.NaiveOpsPerSec
}

// Bench times replays of tr through the host path and through the naive
// map + list LRU, alternating rounds so both see the same machine state,
// and returns the median rates. `kvtier bench radix` and the package's
// go test benchmarks share it.
func Bench(tr *Trace, reg *policy.Registry, cfg BenchConfig) (BenchResult, error) {
	cfg.defaults()
	if cfg.OneCore {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	}
	res := BenchResult{Trace: tr.Name, Policy: cfg.Policy.Name, CapacityTokens: cfg.CapacityTokens, BlockOps: tr.Blocks(), Rounds: cfg.Rounds}
	if _, err := NewEvictor(reg, tr, cfg.Policy); err != nil {
		return res, err
	}
	host := func() (float64, error) {
		ev, err := NewEvictor(reg, tr, cfg.Policy)
		if err != nil {
			return 0, err
		}
		r, err := HostReplay(tr, ev, cfg.CapacityTokens)
		return r.HitRate, err
	}
	naive := func() (float64, error) {
		return NaiveLRUReplay(tr, cfg.CapacityTokens), nil
	}
	var hostRates, naiveRates []float64
	for range cfg.Rounds {
		for _, side := range []struct {
			run   func() (float64, error)
			rates *[]float64
			hit   *float64
		}{{host, &hostRates, &res.HostHitRate}, {naive, &naiveRates, &res.NaiveHitRate}} {
			runtime.GC()
			n := 0
			start, cpu0 := time.Now(), measure.ProcessCPU()
			for n == 0 || time.Since(start) < cfg.MinRound {
				hr, err := side.run()
				if err != nil {
					return res, err
				}
				*side.hit = hr
				n++
			}
			// NB: the rate is per CPU-second of this process (user +
			// system, GC included), not per wall-second: on a shared
			// machine the wall clock also counts time spent waiting for a
			// core, which says nothing about the code.
			elapsed := measure.ProcessCPU() - cpu0
			if elapsed <= 0 {
				elapsed = time.Since(start)
			}
			*side.rates = append(*side.rates, float64(n*tr.Blocks())/elapsed.Seconds())
		}
	}
	res.HostOpsPerSec = measure.Median(hostRates)
	res.NaiveOpsPerSec = measure.Median(naiveRates)
	return res, nil
}

// HostReplay replays tr through the host path — radix tree, ev, logical
// clock, request locks, evictions — without the miss breakdown: what the
// speed benchmark times.
func HostReplay(tr *Trace, ev policy.Evictor, capacityTokens int64) (Result, error) {
	r, err := newRunner(tr, ev, capacityTokens, false)
	if err != nil {
		return Result{}, err
	}
	for i := range tr.Requests() {
		if err := r.request(i); err != nil {
			return r.finish(), fmt.Errorf("policy %s at %d tokens: %w", ev.Name(), capacityTokens, err)
		}
	}
	return r.finish(), nil
}

// NaiveLRUReplay is the speed reference of the radix benchmark: the
// textbook LRU cache, a Go map from page key to a container/list element,
// most recent at the front, evicting from the back, block by block, with
// no tree, no leaf-only constraint, no locks and no policy interface. It
// returns the token hit rate (prefix hit as in replay).
func NaiveLRUReplay(tr *Trace, capacityTokens int64) float64 {
	capacity := int(Capacity(capacityTokens))
	items := make(map[pagehash.Hash]*list.Element)
	order := list.New()
	var hitTokens int64
	for i := range tr.Requests() {
		keys, input, _ := tr.request(i)
		hit, prefix := 0, true
		for _, k := range keys {
			if e, ok := items[k]; ok {
				order.MoveToFront(e)
				if prefix {
					hit++
				}
				continue
			}
			prefix = false
			items[k] = order.PushFront(k)
			if capacity > 0 && order.Len() > capacity {
				old := order.Back()
				order.Remove(old)
				delete(items, old.Value.(pagehash.Hash))
			}
		}
		hitTokens += int64(min(hit*workload.BlockTokens, input))
	}
	if tr.InputTokens() == 0 {
		return 0
	}
	return float64(hitTokens) / float64(tr.InputTokens())
}

package serve

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/host/replay"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
)

// shadowQueue bounds the lookups waiting for the shadows; a step never
// waits for them (past it, lookups are dropped and counted).
const shadowQueue = 4096

// shadowTier is one capacity the shadows replay at: a live tier's.
type shadowTier struct {
	name  string
	pages int64
}

// shadows replays rank 0's accepted lookups, off the step's path, through
// metadata-only trees (replay.Online: no bytes, no copies), one per
// (policy, tier): the live policy and each shadow policy, each at the
// capacity of each live tier alone. A tree follows `kvtier replay`'s
// semantics, so a recording of the same lookups (Config.Record) replayed at
// the same policy and capacity gives the same hit rate. Hit tokens are
// counted in the stack's page tokens; compare hit rates, never a shadow's
// hits with the live tiers' own counters, which also count reloads and
// holds.
type shadows struct {
	policies   []string // the live policy first
	tiers      []shadowTier
	pageTokens int64
	log        *slog.Logger

	q    *offPath[[]pagehash.Hash]
	done chan struct{}

	// run[p][t] is policy p's tree at tier t's capacity, nil once it
	// failed; only the worker touches it.
	run [][]*replay.Online
	// hits[p][t] are its hit tokens; lookups and the rest are read by
	// scrapes.
	hits    [][]atomic.Int64
	lookups atomic.Int64 // tokens asked for by the lookups taken
	taken   atomic.Int64 // lookups replayed
	failed  atomic.Int64 // trees stopped by an error
	busy    atomic.Int64 // nanoseconds the worker spent replaying
}

// openShadows starts the shadows of live (the stack's policy) and names at
// tiers; names may repeat live (it runs once).
func openShadows(live string, names []string, tiers []shadowTier, pageTokens int64, log *slog.Logger) (*shadows, error) {
	reg, err := builtin.Policies()
	if err != nil {
		return nil, err
	}
	s := &shadows{policies: []string{live}, tiers: tiers, pageTokens: pageTokens, log: log,
		q: newOffPath[[]pagehash.Hash](shadowQueue), done: make(chan struct{})}
	for _, n := range names {
		if n != live {
			s.policies = append(s.policies, n)
		}
	}
	s.run = make([][]*replay.Online, len(s.policies))
	s.hits = make([][]atomic.Int64, len(s.policies))
	for p, name := range s.policies {
		f, err := reg.Lookup(policy.EvictorV1, name)
		if err != nil {
			return nil, fmt.Errorf("shadow policy %q: %w", name, err)
		}
		s.hits[p] = make([]atomic.Int64, len(tiers))
		for _, t := range tiers {
			ev, err := f.Factory(policy.Options{Params: map[string]float64{}})
			if err != nil {
				return nil, fmt.Errorf("shadow policy %q (shadows run online, with default params): %w", name, err)
			}
			on, err := replay.NewOnline(fmt.Sprintf("shadow %s at %s", name, t.name), ev, t.pages*replay.BlockTokens)
			if err != nil {
				return nil, fmt.Errorf("shadow policy %q at tier %s (%d pages): %w", name, t.name, t.pages, err)
			}
			s.run[p] = append(s.run[p], on)
		}
	}
	go s.work()
	return s, nil
}

// Take queues one lookup's page keys; it never blocks (a full queue drops
// the lookup and counts it) and keeps no reference to key.
func (s *shadows) Take(key []pagehash.Hash) {
	if s == nil || len(key) == 0 {
		return
	}
	s.q.Send(append([]pagehash.Hash(nil), key...))
}

func (s *shadows) work() {
	defer close(s.done)
	for key := range s.q.Recv() {
		start := time.Now()
		input := len(key) * replay.BlockTokens
		// NB: the denominator first, so that a scrape never sees a hit
		// rate above the replay's.
		s.lookups.Add(int64(len(key)) * s.pageTokens)
		for p, row := range s.run {
			for t, on := range row {
				if on == nil {
					continue
				}
				h, err := on.Request(key, input, 0)
				if err != nil {
					s.run[p][t] = nil
					s.failed.Add(1)
					s.log.Error("kvtier serve: shadow policy stopped", "policy", s.policies[p], "tier", s.tiers[t].name, "err", err)
					continue
				}
				s.hits[p][t].Add(h / replay.BlockTokens * s.pageTokens)
			}
		}
		s.taken.Add(1)
		s.busy.Add(int64(time.Since(start)))
	}
}

// Idle reports whether every lookup taken so far has been replayed.
func (s *shadows) Idle() bool { return s.q.Len() == 0 }

// Result returns the replay result of policy at tier (for tests and the
// bench), after the worker has drained: call it after Close.
func (s *shadows) Result(pol, tier string) (replay.Result, bool) {
	for p, name := range s.policies {
		for t, st := range s.tiers {
			if name == pol && st.name == tier && s.run[p][t] != nil {
				return s.run[p][t].Result(), true
			}
		}
	}
	return replay.Result{}, false
}

// Close stops the shadows after the queued lookups are replayed.
func (s *shadows) Close() {
	if s == nil {
		return
	}
	s.q.Close()
	<-s.done
	if d := s.q.Dropped(); d > 0 {
		s.log.Warn("kvtier serve: shadow policies dropped lookups (their worker fell behind); their hit rates cover the rest", "dropped", d, "replayed", s.taken.Load())
	}
}

var (
	mShadowHits    = d("kvtier_shadow_hit_tokens_total", "Hit tokens of a metadata-only replay of rank 0's lookups under a policy at one live tier's capacity (policy: the live policy and each --shadow policy).", prometheus.CounterValue, "policy", "tier")
	mShadowLookups = d("kvtier_shadow_lookup_tokens_total", "Tokens of the lookups the shadow policies replayed (the denominator of their hit rates).", prometheus.CounterValue)
	mShadowLive    = d("kvtier_shadow_live_policy", "1 for the policy that serves the live tiers, 0 for a shadow.", prometheus.GaugeValue, "policy")
	mShadowPages   = d("kvtier_shadow_capacity_pages", "The capacity, in pages, the shadows replay a tier at (the live tier's).", prometheus.GaugeValue, "tier")
	mShadowDropped = d("kvtier_shadow_dropped_lookups_total", "Lookups the shadows dropped because their worker fell behind.", prometheus.CounterValue)
	mShadowFailed  = d("kvtier_shadow_failed_trees", "Shadow trees stopped by an error (logged).", prometheus.GaugeValue)
	mShadowBusy    = d("kvtier_shadow_busy_seconds_total", "Time the shadows' worker spent replaying (off the step's path).", prometheus.CounterValue)
)

var shadowDescs = []desc{mShadowHits, mShadowLookups, mShadowLive, mShadowPages, mShadowDropped, mShadowFailed, mShadowBusy}

// shadowCollector exports the shadows' counters.
type shadowCollector struct{ s *shadows }

func (c shadowCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range shadowDescs {
		ch <- d.Desc
	}
}

func (c shadowCollector) Collect(ch chan<- prometheus.Metric) {
	emit := emitter(ch)
	s := c.s
	for p, name := range s.policies {
		live := 0.0
		if p == 0 {
			live = 1
		}
		emit(mShadowLive, live, name)
		for t, st := range s.tiers {
			emit(mShadowHits, float64(s.hits[p][t].Load()), name, st.name)
		}
	}
	for _, st := range s.tiers {
		emit(mShadowPages, float64(st.pages), st.name)
	}
	emit(mShadowLookups, float64(s.lookups.Load()))
	emit(mShadowDropped, float64(s.q.Dropped()))
	emit(mShadowFailed, float64(s.failed.Load()))
	emit(mShadowBusy, time.Duration(s.busy.Load()).Seconds())
}

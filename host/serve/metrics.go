package serve

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/host"
	"github.com/kvtier/kvtier/host/control"
)

// snapshot is what a rank publishes after every call for the metrics (the
// Node and Machine belong to the rank's goroutine; a scrape reads this).
type snapshot struct {
	// node and ticks are totals over every epoch of the rank (the
	// current Node's plus past): counters never go back.
	node                        host.Stats
	ticks                       uint64
	l1Total, l2Total            int64
	l1Free, l2Free              int64
	poolInflight, storeInflight int
	queue                       int
	held, liveRequests          int
}

// epochTotals are the counters of a rank's retired Nodes and Machines.
type epochTotals struct {
	node  host.Stats
	ticks uint64
}

// add returns t plus a Node's stats and its Machine's ticks.
func (t epochTotals) add(st host.Stats, ticks uint64) epochTotals {
	out := epochTotals{ticks: t.ticks + ticks}
	out.node = host.Stats{L1ToL2: t.node.L1ToL2 + st.L1ToL2, L2ToL3: t.node.L2ToL3 + st.L2ToL3,
		L3ToL2: t.node.L3ToL2 + st.L3ToL2, L2ToL1: t.node.L2ToL1 + st.L2ToL1, Ticks: t.node.Ticks + st.Ticks,
		Skips: map[string]int64{}, FailedOps: map[string]int64{}}
	for _, m := range []map[string]int64{t.node.Skips, st.Skips} {
		for k, v := range m {
			out.node.Skips[k] += v
		}
	}
	for _, m := range []map[string]int64{t.node.FailedOps, st.FailedOps} {
		for k, v := range m {
			out.node.FailedOps[k] += v
		}
	}
	return out
}

// retire adds the counters of the rank's Node and Machine to its past
// totals; reset calls it before it replaces them with a new epoch's.
func (r *rank) retire() {
	if r.node == nil {
		return
	}
	r.past = r.past.add(r.node.Stats(), r.node.Ticks())
}

func (r *rank) publish() {
	l1, l2 := r.node.Free()
	tot := r.past.add(r.node.Stats(), r.node.Ticks())
	pool, store := r.node.InFlight()
	sn := &snapshot{node: tot.node, ticks: tot.ticks, l1Total: r.mo.L1Pages, l2Total: r.mo.L2.Kinds[0].Pages(), l1Free: l1, l2Free: l2,
		poolInflight: pool, storeInflight: store, queue: r.node.SpillQueueLen()}
	// NB: with one Machine for the node's ranks only rank 0 keeps the
	// session's requests (nodemachine.go); the others report its.
	src := r
	if r.srv.oneMachine() && len(r.srv.ranks) > 0 {
		src = r.srv.ranks[0]
	}
	if r.sess != nil && src.sess != nil {
		sn.liveRequests = len(src.sess.reqs)
		// Held: live requests whose lookup is still PENDING (waiting
		// for an L3 lookup or reload, or for the load-back plan into
		// L1), what the engine sees as held. The Machine's Held set
		// alone misses the load-backs: a request whose pages came back
		// from L3 waits for its FROM_SLAB plan, not for a reload.
		for _, rq := range src.sess.reqs {
			if !rq.done {
				sn.held++
			}
		}
	}
	r.snap.Store(sn)
}

// metrics is serve's Prometheus registry: a collector over the ranks'
// snapshots and tiers' stats, and histograms the ranks observe.
type metrics struct {
	s              *Server
	reg            *prometheus.Registry
	step, exchange *prometheus.HistogramVec
	// barrier: with one Machine for the node's ranks, how long a rank's
	// step waited for the others' (nodemachine.go).
	barrier        *prometheus.HistogramVec
	unknownSession atomic.Int64
}

var latencyBuckets = []float64{50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 20e-3, 50e-3, 100e-3, 500e-3}

func newMetrics(s *Server) *metrics {
	m := &metrics{s: s, reg: prometheus.NewRegistry()}
	m.step = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvtier_step_duration_seconds", Help: "Time serve spends on one Step call of an engine rank, queueing excluded.", Buckets: latencyBuckets}, []string{"rank"})
	m.exchange = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvtier_group_exchange_duration_seconds", Help: "Time of one rank-group exchange (contribution to frontier).", Buckets: latencyBuckets}, []string{"rank"})
	m.barrier = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvtier_step_barrier_wait_seconds", Help: "With one Machine for the node's ranks: time a rank's step waited for the other ranks' steps (0 for the last to arrive).", Buckets: latencyBuckets}, []string{"rank"})
	m.reg.MustRegister(m.step, m.exchange, m.barrier, collector{m}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.reg.MustRegister(storeCollector{s})
	return m
}

func (m *metrics) observeStep(rank int, d time.Duration) {
	m.step.WithLabelValues(strconv.Itoa(rank)).Observe(d.Seconds())
}

func (m *metrics) observeBarrier(rank int, d time.Duration) {
	m.barrier.WithLabelValues(strconv.Itoa(rank)).Observe(d.Seconds())
}

func (m *metrics) observeExchange(rank int, d time.Duration) {
	m.exchange.WithLabelValues(strconv.Itoa(rank)).Observe(d.Seconds())
}

// handler serves /metrics, /healthz (the process answers) and /readyz
// (every rank is open and serving).
func (m *metrics) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		m.s.mu.RLock()
		ready := m.s.ready
		m.s.mu.RUnlock()
		if !ready {
			http.Error(w, "not ready: serve is starting or draining", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	return mux
}

type desc struct {
	*prometheus.Desc
	kind prometheus.ValueType
}

// emitter returns a function that sends one constant metric of d to ch.
func emitter(ch chan<- prometheus.Metric) func(d desc, v float64, labels ...string) {
	return func(d desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d.Desc, d.kind, v, labels...)
	}
}

func d(name, help string, kind prometheus.ValueType, labels ...string) desc {
	return desc{prometheus.NewDesc(name, help, labels, nil), kind}
}

var (
	mTierUsed     = d("kvtier_tier_used_pages", "Pages held by a tier.", prometheus.GaugeValue, "rank", "tier")
	mTierTotal    = d("kvtier_tier_capacity_pages", "Pages a tier can hold.", prometheus.GaugeValue, "rank", "tier")
	mTierHits     = d("kvtier_tier_hits_total", "Pages a lookup found in the tier (L1, L2, L3), or store Get items that hit.", prometheus.CounterValue, "rank", "tier")
	mTierMisses   = d("kvtier_tier_misses_total", "Store Get items that missed.", prometheus.CounterValue, "rank", "tier")
	mTierCorrupt  = d("kvtier_tier_corrupt_reads_total", "Store Get items refused by verification.", prometheus.CounterValue, "rank", "tier")
	mTierBytes    = d("kvtier_tier_bytes_total", "Bytes moved into (in) and out of (out) a tier.", prometheus.CounterValue, "rank", "tier", "direction")
	mTierInflight = d("kvtier_tier_inflight_operations", "Batches in flight on a tier: copy plans the engine owes (l1) and store operations (the store's name).", prometheus.GaugeValue, "rank", "tier")
	mTierQueue    = d("kvtier_tier_queue_depth", "Nodes waiting in the L2 to L3 spill queue.", prometheus.GaugeValue, "rank")
	mTierGC       = d("kvtier_tier_gc_reclaimed_pages_total", "Pages the store's garbage collection reclaimed.", prometheus.CounterValue, "rank", "tier")
	mTierWriteErr = d("kvtier_tier_write_errors_total", "Store put items that failed.", prometheus.CounterValue, "rank", "tier")
	mSkips        = d("kvtier_skips_total", "Decisions not taken, by reason.", prometheus.CounterValue, "rank", "reason")
	mFailedOps    = d("kvtier_failed_operations_total", "Operations that failed on this rank, by kind.", prometheus.CounterValue, "rank", "kind")
	mFallbacks    = d("kvtier_fallbacks", "1 when a tier runs on its fallback (the L2 slab on shm instead of hugetlbfs).", prometheus.GaugeValue, "rank", "tier")
	mSteps        = d("kvtier_steps_total", "Step calls served.", prometheus.CounterValue, "rank")
	mItemErrors   = d("kvtier_item_errors_total", "Step items refused, by code.", prometheus.CounterValue, "rank", "code")
	mSessions     = d("kvtier_sessions", "Open engine sessions.", prometheus.GaugeValue)
	mSessionEnds  = d("kvtier_session_ends_total", "Sessions ended, by why: closed, disconnected, expired, replaced, group_stopped (a tick of the group failed), group_ended (another rank's session ended).", prometheus.CounterValue, "rank", "why")
	mRolledBack   = d("kvtier_rolled_back_plans_total", "Copy plans failed because their session ended (kvtier_overdue_plans_total counts those failed by the deadline).", prometheus.CounterValue, "rank")
	mLookupPages  = d("kvtier_lookup_pages_total", "Looked-up pages by outcome (hit, miss).", prometheus.CounterValue, "rank", "outcome")
	mDigests      = d("kvtier_digest_checks_total", "Digests of the replicated state computed and offered for comparison (group exchanges on digest ticks; a rank of one: digests in Step replies).", prometheus.CounterValue, "rank")
	mMismatch     = d("kvtier_digest_mismatches_total", "Group exchanges that failed because the ranks' digests differed.", prometheus.CounterValue, "rank")
	mOverdue      = d("kvtier_overdue_plans_total", "Copy plans failed because the engine did not report them within the plan deadline.", prometheus.CounterValue, "rank")
	mTicks        = d("kvtier_ticks_total", "Machine ticks.", prometheus.CounterValue, "rank")
	mHeld         = d("kvtier_held_requests", "Live requests whose lookup is PENDING (waiting for an L3 lookup or reload, or a load-back into L1).", prometheus.GaugeValue, "rank")
	mUnknownSess  = d("kvtier_unknown_session_steps_total", "Steps naming a session serve does not have.", prometheus.CounterValue)
)

var allDescs = []desc{mTierUsed, mTierTotal, mTierHits, mTierMisses, mTierCorrupt, mTierBytes, mTierInflight, mTierQueue, mTierGC, mTierWriteErr,
	mSkips, mFailedOps, mFallbacks, mSteps, mItemErrors, mSessions, mSessionEnds, mRolledBack, mLookupPages, mDigests, mMismatch, mOverdue, mTicks, mHeld, mUnknownSess}

// failedKinds are the kinds of host.Stats.FailedOps.
var failedKinds = []string{"copy", "put", "get", "lookup", "timeout"}

func knownSkip(name string) bool {
	for r := control.SkipCapacity; r <= control.SkipWatermark; r++ {
		if r.String() == name {
			return true
		}
	}
	return false
}

type collector struct{ m *metrics }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d.Desc
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	emit := emitter(ch)
	emit(mSessions, float64(c.m.s.sessionCount()))
	emit(mUnknownSess, float64(c.m.unknownSession.Load()))
	for _, r := range c.m.s.ranks {
		rk := strconv.Itoa(r.idx)
		sn := r.snap.Load()
		if sn == nil {
			continue
		}
		st := &r.stats
		emit(mTierUsed, float64(sn.l1Total-sn.l1Free), rk, "l1")
		emit(mTierTotal, float64(sn.l1Total), rk, "l1")
		emit(mTierUsed, float64(sn.l2Total-sn.l2Free), rk, "l2")
		emit(mTierTotal, float64(sn.l2Total), rk, "l2")
		emit(mTierHits, float64(st.hitByTier[1].Load()), rk, "l1")
		emit(mTierHits, float64(st.hitByTier[2].Load()), rk, "l2")
		emit(mTierHits, float64(st.hitByTier[3].Load()), rk, "l3")
		emit(mTierBytes, float64(sn.node.L1ToL2), rk, "l2", "in")
		emit(mTierBytes, float64(sn.node.L2ToL1), rk, "l2", "out")
		emit(mTierBytes, float64(sn.node.L2ToL3), rk, "l3", "in")
		emit(mTierBytes, float64(sn.node.L3ToL2), rk, "l3", "out")
		emit(mTierInflight, float64(sn.poolInflight), rk, "l1")
		if len(r.st.Stores) > 0 {
			emit(mTierInflight, float64(sn.storeInflight), rk, r.st.Stores[0].Name)
		}
		emit(mTierQueue, float64(sn.queue), rk)
		emit(mHeld, float64(sn.held), rk)
		emit(mTicks, float64(sn.ticks), rk)
		fb := 0.0
		if r.st.Slab.Geometry().Backing != "hugetlbfs" {
			fb = 1
		}
		emit(mFallbacks, fb, rk, "l2")
		for _, t := range r.st.Stores {
			ss := t.Store.Stats()
			emit(mTierUsed, float64(ss.Pages), rk, t.Name)
			if pb := r.st.Config.Payload.Kinds[0].PageBytes; ss.CapacityBytes > 0 && pb > 0 {
				emit(mTierTotal, float64(ss.CapacityBytes/pb), rk, t.Name)
			}
			emit(mTierHits, float64(ss.Hits), rk, t.Name+"_get")
			emit(mTierMisses, float64(ss.Misses), rk, t.Name)
			emit(mTierCorrupt, float64(ss.Corrupt), rk, t.Name)
			emit(mTierGC, float64(ss.Evictions), rk, t.Name)
			emit(mTierWriteErr, float64(ss.PutFailures), rk, t.Name)
		}
		// Every known reason and kind, 0 until it happens, so a series
		// exists from the first scrape (and rate() sees its first step).
		for reason := control.SkipCapacity; reason <= control.SkipWatermark; reason++ {
			emit(mSkips, float64(sn.node.Skips[reason.String()]), rk, reason.String())
		}
		for reason, n := range sn.node.Skips {
			if !knownSkip(reason) {
				emit(mSkips, float64(n), rk, reason)
			}
		}
		for _, kind := range failedKinds {
			emit(mFailedOps, float64(sn.node.FailedOps[kind]), rk, kind)
		}
		for kind, n := range sn.node.FailedOps {
			if !slices.Contains(failedKinds, kind) {
				emit(mFailedOps, float64(n), rk, kind)
			}
		}
		emit(mSteps, float64(st.steps.Load()), rk)
		for code := 1; code < len(st.itemErrors); code++ {
			if n := st.itemErrors[code].Load(); n > 0 {
				emit(mItemErrors, float64(n), rk, errorCodeName(code))
			}
		}
		emit(mSessionEnds, float64(st.expired.Load()), rk, "expired")
		emit(mSessionEnds, float64(st.replaced.Load()), rk, "replaced")
		emit(mSessionEnds, float64(st.disconnected.Load()), rk, "disconnected")
		emit(mSessionEnds, float64(st.closed.Load()), rk, "closed")
		emit(mSessionEnds, float64(st.groupStopped.Load()), rk, "group_stopped")
		emit(mSessionEnds, float64(st.groupEnded.Load()), rk, "group_ended")
		emit(mOverdue, float64(st.overduePlans.Load()), rk)
		emit(mRolledBack, float64(st.rolledBack.Load()), rk)
		emit(mLookupPages, float64(st.hitPages.Load()), rk, "hit")
		emit(mLookupPages, float64(st.missPages.Load()), rk, "miss")
		emit(mDigests, float64(st.digests.Load()), rk)
		emit(mMismatch, float64(st.mismatches.Load()), rk)
	}
}

func errorCodeName(code int) string {
	n := pb.ErrorCode(code).String()
	return strings.ToLower(strings.TrimPrefix(n, "ERROR_CODE_"))
}

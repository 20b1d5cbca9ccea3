// Package loadgen is `kvtier loadgen`: a synthetic engine of N rank
// sessions driving a running kvtier serve with a trace. Each rank has an
// L1 pool in host memory, writes every placed page's payload (host.Payload
// of its hash), runs the copy plans through the mapped slab, and verifies
// every loaded page byte for byte. The ranks run the same requests in the
// same steps (a context-parallel engine), so serve's rank group sees them
// in lockstep.
package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/trace"
	"slices"
	"strings"
	"sync"
	"time"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/host"
	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/internal/crc32c"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/workload"
)

// Config configures a run.
type Config struct {
	// Socket is serve's socket.
	Socket string
	// Ranks is the number of rank sessions (serve's rank count).
	Ranks int
	// Requests is the trace.
	Requests []workload.Request
	// PerStep is the most new requests looked up per step (default 8).
	PerStep int
	// MaxLive bounds requests looked up and not finished (default 32).
	MaxLive int
	// MaxPages caps a request's key (default 64 pages).
	MaxPages int
	// Model names the namespace (default "loadgen").
	Model string
	// Ping times an empty call on the same connection before every step:
	// the limit a step's latency is measured against.
	Ping bool
	// NoPayload skips writing and verifying payload bytes (the copies
	// still run): for benchmarks, so the synthetic engine's own CPU does
	// not crowd out serve on a small machine. wrong_bytes is then not
	// measured (verified_pages stays 0).
	NoPayload bool
	// NoCopies reports every plan done without copying (benchmarks of
	// the control plane alone: a GPU engine's copies are DMA, not CPU).
	NoCopies bool
}

// Result is one run. The JSON keys are a public contract.
type Result struct {
	Ranks int `json:"ranks"`
	// OwnerLanes is what serve's Register said (1: every rank holds every
	// page; above 1: page i is rank i mod owner_lanes's, and each rank
	// wrote and verified only its own).
	OwnerLanes      int              `json:"owner_lanes"`
	Requests        int64            `json:"requests"`
	InputTokens     int64            `json:"input_tokens"`
	HitTokens       int64            `json:"hit_tokens"`
	HitRate         float64          `json:"hit_rate"`
	HitTokensByTier map[string]int64 `json:"hit_tokens_by_tier"`
	VerifiedPages   int64            `json:"verified_pages"`
	WrongBytes      int64            `json:"wrong_bytes"`
	Errors          int64            `json:"errors"`
	Restarts        int64            `json:"restarts"`
	Steps           int64            `json:"steps"`
	StepUsP50       float64          `json:"step_us_p50"`
	StepUsP99       float64          `json:"step_us_p99"`
	StepUsMax       float64          `json:"step_us_max"`
	PingUsP50       float64          `json:"ping_us_p50,omitempty"`
	PingUsP99       float64          `json:"ping_us_p99,omitempty"`
	LoadGBps        float64          `json:"load_gbps"`
	StoreGBps       float64          `json:"store_gbps"`
	// MemcpyGBps is the copies' limit, measured beside them: after a
	// plan (while the limit has copied under a quarter of the bytes the
	// plans have), each rank copies as many bytes, run by run, between two
	// scratch buffers of its own (out of cache), and this is those
	// copies' bytes over their time, summed over the ranks: the same
	// statistic as LoadGBps and StoreGBps, under the same load from serve
	// and the other ranks. 0 when no copies ran.
	MemcpyGBps float64 `json:"memcpy_gbps"`
	// MemcpyAfterGBps is the best of five passes of Memcpy after the run,
	// on an idle serve: the limit before 2026-12-07, kept for comparison.
	// 0 when no copies ran.
	MemcpyAfterGBps float64 `json:"memcpy_after_gbps"`
	LoadRatio       float64 `json:"load_ratio"`
	StoreRatio      float64 `json:"store_ratio"`
	LoadedBytes     int64   `json:"loaded_bytes"`
	// CopyShare is the engine copies' share of the run's wall time
	// (loads and stores, every rank's summed over the ranks); the
	// GB/s figures are over the copies' own time.
	CopyShare float64 `json:"copy_share"`
	// CopyItems and CopyRuns count plan items and the copies they were
	// run as (items contiguous in L1 and the slab are one run).
	CopyItems int64 `json:"copy_items"`
	CopyRuns  int64 `json:"copy_runs"`
	// SummedItems counts the TO_SLAB plan items reported with their
	// CRC-32C (Completion.sums), which serve's tiers keep with the page.
	SummedItems int64   `json:"summed_items"`
	StoredBytes int64   `json:"stored_bytes"`
	Seconds     float64 `json:"seconds"`
	PageTokens  int     `json:"page_tokens"`
	PageBytes   int64   `json:"page_bytes"`
	L1Pages     int     `json:"l1_pages"`
	FirstError  string  `json:"first_error,omitempty"`
}

// Check is a run's verdict: an error, saying why, when a byte loaded was
// wrong, when any step or item errored, or when verifying (payloads
// written and checked, not Config.NoPayload) and no page was verified (a
// run whose loads were never checked proves nothing).
func (r Result) Check(verifying bool) error {
	var why []string
	if r.WrongBytes != 0 {
		why = append(why, fmt.Sprintf("%d wrong bytes", r.WrongBytes))
	}
	if r.Errors != 0 {
		e := fmt.Sprintf("%d errors", r.Errors)
		if r.FirstError != "" {
			e += " (first: " + r.FirstError + ")"
		}
		why = append(why, e)
	}
	if verifying && r.VerifiedPages == 0 {
		why = append(why, fmt.Sprintf("no page verified: no lookup of %d requests hit a page it could check", r.Requests))
	}
	if len(why) == 0 {
		return nil
	}
	return fmt.Errorf("loadgen: the run failed: %s", strings.Join(why, "; "))
}

// Key turns a trace request's block ids into its page hash chain: page i
// hashes page_tokens tokens derived from block i's id (a splitmix64
// stream), chained, so equal id prefixes give equal keys.
func Key(ids []uint64, pageTokens, max int) []pagehash.Hash {
	n := min(len(ids), max)
	out := make([]pagehash.Hash, n)
	toks := make([]uint32, pageTokens)
	prev := pagehash.Root
	for i := range n {
		s := ids[i]
		for j := range toks {
			s += 0x9e3779b97f4a7c15
			z := (s ^ s>>30) * 0xbf58476d1ce4e5b9
			z = (z ^ z>>27) * 0x94d049bb133111eb
			toks[j] = uint32(z ^ z>>31)
		}
		prev = pagehash.Next(prev, toks)
		out[i] = prev
	}
	return out
}

// Run drives serve with cfg's trace on every rank and returns the totals
// (rank 0's request counts; bytes and errors of all ranks).
func Run(ctx context.Context, cfg Config) (Result, error) {
	if cfg.Ranks < 1 || cfg.Ranks > 64 {
		return Result{}, fmt.Errorf("loadgen: %d ranks, want 1..64", cfg.Ranks)
	}
	if cfg.PerStep <= 0 {
		cfg.PerStep = 8
	}
	if cfg.MaxLive <= 0 {
		cfg.MaxLive = 32
	}
	if cfg.MaxPages <= 0 {
		cfg.MaxPages = 64
	}
	if cfg.Model == "" {
		cfg.Model = "loadgen"
	}
	probe, err := client.Health(ctx, cfg.Socket)
	if err != nil {
		return Result{}, fmt.Errorf("loadgen: %w", err)
	}
	if int(probe.GetRanks()) != cfg.Ranks {
		return Result{}, fmt.Errorf("loadgen: serve hosts %d ranks, --ranks is %d", probe.GetRanks(), cfg.Ranks)
	}
	ns := &pb.Namespace{Model: cfg.Model, KvLayout: "layer_first", Dtype: "bf16", PageTokens: probe.GetPageTokens()}
	for _, k := range probe.GetKinds() {
		ns.PageBytes = append(ns.PageBytes, k.GetPageBytes())
	}
	keys := make([][]pagehash.Hash, len(cfg.Requests))
	for i, r := range cfg.Requests {
		keys[i] = Key(r.HashIDs, int(probe.GetPageTokens()), cfg.MaxPages)
	}
	ranks := make([]*rank, cfg.Ranks)
	for i := range ranks {
		n := proto(ns)
		n.Shard = uint32(i)
		c, err := client.Dial(ctx, client.Options{Socket: cfg.Socket, EngineID: "loadgen", Rank: i, WorldSize: cfg.Ranks, Namespace: n})
		if err != nil {
			for _, r := range ranks[:i] {
				r.close(ctx)
			}
			return Result{}, fmt.Errorf("loadgen: rank %d: %w", i, err)
		}
		ranks[i] = &rank{idx: i, c: c, cfg: cfg, keys: keys}
		if err := ranks[i].attach(); err != nil {
			for _, r := range ranks[:i+1] {
				r.close(ctx)
			}
			return Result{}, fmt.Errorf("loadgen: rank %d: %w", i, err)
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	idle := newIdleBarrier(len(ranks))
	for _, r := range ranks {
		r.idle = idle
		wg.Add(1)
		go func() { defer wg.Done(); defer idle.leave(); r.run(ctx) }()
	}
	wg.Wait()
	res := Result{Ranks: cfg.Ranks, Seconds: time.Since(start).Seconds(), HitTokensByTier: map[string]int64{},
		PageTokens: int(probe.GetPageTokens()), L1Pages: int(ranks[0].c.Info().GetLimits().GetL1Pages())}
	for _, k := range probe.GetKinds() {
		res.PageBytes += int64(k.GetPageBytes())
	}
	var lat, pings []time.Duration
	var loadNs, storeNs, limitBytes, limitNs int64
	for _, r := range ranks {
		if r.idx == 0 {
			res.Requests, res.InputTokens, res.HitTokens = r.requests, r.input, r.hits[1]+r.hits[2]+r.hits[3]
			for t, name := range []string{"", "l1", "l2", "l3"} {
				if t > 0 {
					res.HitTokensByTier[name] = r.hits[t]
				}
			}
			res.Steps = r.steps
		}
		res.VerifiedPages += r.verified
		res.WrongBytes += r.wrong
		res.OwnerLanes = max(res.OwnerLanes, 1, int(r.c.Info().GetOwnerLanes()))
		res.Errors += r.errors
		res.Restarts += r.restarts
		res.LoadedBytes += r.loaded
		res.StoredBytes += r.stored
		loadNs += r.loadNs
		storeNs += r.storeNs
		limitBytes += r.limit.bytes
		limitNs += r.limit.ns
		res.CopyItems += r.copyItems
		res.CopyRuns += r.copyRuns
		res.SummedItems += r.summed
		lat = append(lat, r.lat...)
		pings = append(pings, r.pings...)
		if res.FirstError == "" && r.firstErr != "" {
			res.FirstError = r.firstErr
		}
		r.close(ctx)
	}
	if res.InputTokens > 0 {
		res.HitRate = float64(res.HitTokens) / float64(res.InputTokens)
	}
	slices.Sort(lat)
	if n := len(lat); n > 0 {
		res.StepUsP50 = us(lat[n/2])
		res.StepUsP99 = us(lat[min(n-1, n*99/100)])
		res.StepUsMax = us(lat[n-1])
	}
	slices.Sort(pings)
	if n := len(pings); n > 0 {
		res.PingUsP50 = us(pings[n/2])
		res.PingUsP99 = us(pings[min(n-1, n*99/100)])
	}
	if loadNs > 0 {
		res.LoadGBps = float64(res.LoadedBytes) / float64(loadNs)
	}
	if storeNs > 0 {
		res.StoreGBps = float64(res.StoredBytes) / float64(storeNs)
	}
	if wall := res.Seconds*1e9*float64(res.Ranks) - float64(limitNs); wall > 0 {
		// NB: the limit's own copies are not the engine's time.
		res.CopyShare = float64(loadNs+storeNs) / wall
	}
	if limitNs > 0 {
		res.MemcpyGBps = float64(limitBytes) / float64(limitNs)
		// NB: only where copies ran: it is their figure (a control-plane
		// run would spend 128 MiB and five passes on a number of nothing).
		res.MemcpyAfterGBps = Memcpy(int(res.PageBytes))
	}
	if res.MemcpyGBps > 0 {
		res.LoadRatio, res.StoreRatio = res.LoadGBps/res.MemcpyGBps, res.StoreGBps/res.MemcpyGBps
	}
	return res, nil
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func proto(ns *pb.Namespace) *pb.Namespace {
	return &pb.Namespace{Model: ns.Model, KvLayout: ns.KvLayout, Dtype: ns.Dtype, PageTokens: ns.PageTokens, PageBytes: slices.Clone(ns.PageBytes), Shard: ns.Shard, Salt: ns.Salt}
}

// Memcpy measures a limit of the engine's copies on an idle machine:
// copying page-sized pieces between two 64 MiB buffers (out of cache, as
// the engine's copies between its L1 and the slab are), in GB/s, best of
// five passes. Run reports it as MemcpyAfterGBps; its ratios are against
// the limit measured beside the copies (memcpyLimit).
func Memcpy(pageBytes int) float64 {
	if pageBytes <= 0 {
		return 0
	}
	pages := max(1, (64<<20)/pageBytes)
	src, dst := make([]byte, pages*pageBytes), make([]byte, pages*pageBytes)
	for i := range src {
		src[i] = byte(i)
	}
	best := 0.0
	for range 5 {
		t0 := time.Now()
		for p := range pages {
			copy(dst[p*pageBytes:(p+1)*pageBytes], src[((p*7)%pages)*pageBytes:])
		}
		if g := float64(pages*pageBytes) / float64(time.Since(t0).Nanoseconds()); g > best {
			best = g
		}
	}
	return best
}

// rank is one engine rank.
type rank struct {
	idx  int
	c    *client.Client
	cfg  Config
	keys [][]pagehash.Hash
	slab *client.Slab
	l1   [][]byte // per kind
	kb   []int64  // page bytes per kind
	want []byte

	requests, input, verified, wrong, errors, restarts int64
	hits                                               [4]int64
	steps, loaded, stored, loadNs, storeNs             int64
	copyItems, copyRuns, summed                        int64
	lat, pings                                         []time.Duration
	firstErr                                           string
	// limit times plain copies of the bytes each plan copied.
	limit memcpyLimit
	runs  []int64 // the lengths of the runs of the plan being copied
	// idle is shared by the ranks: a rank stops when every rank is idle.
	idle *idleBarrier
}

// idleBarrier decides, step by step, whether every rank of the run has
// nothing left: agree waits for each rank still running to say whether it
// is idle at this step, and is true when all are. A rank that returned
// (an error) counts as idle from then on.
type idleBarrier struct {
	mu      sync.Mutex
	cond    *sync.Cond
	running int // ranks still in run
	arrived int // ranks that said this round
	busy    bool
	round   uint64
	result  bool
}

func newIdleBarrier(n int) *idleBarrier {
	b := &idleBarrier{running: n}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *idleBarrier) agree(idle bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.arrived++
	b.busy = b.busy || !idle
	round := b.round
	if b.arrived >= b.running {
		b.finish()
		return b.result
	}
	for b.round == round {
		b.cond.Wait()
	}
	return b.result
}

// finish ends the round; b.mu is held.
func (b *idleBarrier) finish() {
	b.result = !b.busy
	b.arrived, b.busy = 0, false
	b.round++
	b.cond.Broadcast()
}

// leave takes a rank that returned out of every later round.
func (b *idleBarrier) leave() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.running--
	if b.arrived > 0 && b.arrived >= b.running {
		b.finish()
	}
}

type req struct {
	name  string
	i     int
	key   []pagehash.Hash
	input int64
}

func (r *rank) attach() error {
	if r.slab != nil {
		r.slab.Close()
	}
	info := r.c.Info()
	s, err := client.MapSlab(info.GetSlab())
	if err != nil {
		return err
	}
	r.slab = s
	n := int(info.GetLimits().GetL1Pages())
	r.l1, r.kb = nil, nil
	for _, k := range info.GetKinds() {
		// NB: the engine's memory is resident; a fresh Go slice is not
		// until written, and on these VMs the first write of each 4 KiB
		// page costs ~10 us (0.3-0.9 GB/s), which the copies would
		// otherwise pay and report as their own.
		r.l1 = append(r.l1, prefault(make([]byte, n*int(k.GetPageBytes()))))
		r.kb = append(r.kb, int64(k.GetPageBytes()))
		if int(k.GetPageBytes()) > len(r.want) {
			r.want = make([]byte, k.GetPageBytes())
		}
	}
	if !r.cfg.NoCopies && r.limit.src == nil {
		r.limit = newMemcpyLimit(r.cfg.Ranks, int(slices.Max(r.kb)))
	}
	return nil
}

// memcpyLimit measures the limit of a rank's copies beside them: after
// a plan (about one byte in four) the rank copies as many bytes, in runs
// of the same lengths, between two scratch buffers of its own with plain
// copy, and times that.
// The buffers are prefaulted and, together over the ranks, about 128 MiB,
// so the copies walk memory out of cache as the engine's do; the source
// runs start half a buffer from the destination's.
type memcpyLimit struct {
	src, dst  []byte
	at        int
	bytes, ns int64
}

func newMemcpyLimit(ranks, pageBytes int) memcpyLimit {
	size := max((64<<20)/max(ranks, 1), 4*pageBytes)
	return memcpyLimit{src: prefault(make([]byte, size)), dst: prefault(make([]byte, size))}
}

// copy times plain copies of runs' lengths.
func (l *memcpyLimit) copy(runs []int64) {
	if len(l.src) == 0 {
		return
	}
	half := len(l.src) / 2
	t0 := time.Now()
	var n int64
	for _, left := range runs {
		for left > 0 {
			k := int(min(left, int64(half)))
			if l.at+k > len(l.dst) {
				l.at = 0
			}
			from := (l.at + half) % len(l.src)
			if from+k > len(l.src) {
				from = 0
			}
			copy(l.dst[l.at:l.at+k], l.src[from:from+k])
			l.at += k
			left -= int64(k)
			n += int64(k)
		}
	}
	l.ns += time.Since(t0).Nanoseconds()
	l.bytes += n
}

func (r *rank) close(ctx context.Context) {
	if r.slab != nil {
		r.slab.Close()
	}
	_ = r.c.Close(ctx)
}

func (r *rank) fail(format string, args ...any) {
	r.errors++
	if r.firstErr == "" {
		r.firstErr = fmt.Sprintf("rank %d: ", r.idx) + fmt.Sprintf(format, args...)
	}
}

func (r *rank) page(kind int, p uint32) ([]byte, error) {
	n := r.kb[kind]
	if int64(p+1)*n > int64(len(r.l1[kind])) {
		return nil, fmt.Errorf("L1 page %d outside the pool", p)
	}
	return r.l1[kind][int64(p)*n : int64(p+1)*n], nil
}

// run is the rank's scheduler loop: every step sends the completions of
// the plans run since the last one, the stores and finishes of requests
// whose lookups came back DONE, and up to PerStep new lookups.
func (r *rank) run(ctx context.Context) {
	live := map[string]*req{}
	var ready []*req
	var owed []*pb.Completion
	next := 0
	for {
		if ctx.Err() != nil {
			return
		}
		q := &pb.StepRequest{Completions: owed}
		owed = nil
		for _, rq := range ready {
			q.Stores = append(q.Stores, &pb.Store{ReqId: rq.name, Pages: uint32(len(rq.key)), Hashes: client.PackHashes(nil, rq.key)})
			q.Finished = append(q.Finished, &pb.Finish{ReqId: rq.name})
		}
		stored := map[string]*req{}
		for _, rq := range ready {
			stored[rq.name] = rq
		}
		ready = nil
		for added := 0; added < r.cfg.PerStep && len(live) < r.cfg.MaxLive && next < len(r.keys); next++ {
			if len(r.keys[next]) == 0 {
				continue
			}
			rq := &req{name: fmt.Sprintf("r%d", next), i: next, key: r.keys[next],
				input: min(int64(r.cfg.Requests[next].InputLength), int64(len(r.keys[next]))*int64(workload.BlockTokens))}
			live[rq.name] = rq
			q.Lookups = append(q.Lookups, &pb.Lookup{ReqId: rq.name, Pages: uint32(len(rq.key)), Hashes: client.PackHashes(nil, rq.key)})
			added++
		}
		// NB: the ranks of a group step in lockstep (every tick waits for
		// each rank's step), so a rank with nothing left steps on, empty,
		// until every rank has nothing left: one that stopped alone (its
		// last plans reported while a peer still owes some) would leave
		// its peer waiting in the exchange until the group timeout.
		if r.idle.agree(len(q.Lookups)+len(q.Stores)+len(q.Completions) == 0 && len(live) == 0) {
			return
		}
		if r.cfg.Ping {
			t0 := time.Now()
			if err := r.c.Ping(ctx); err == nil {
				r.pings = append(r.pings, time.Since(t0))
			}
		}
		t0 := time.Now()
		reg := trace.StartRegion(ctx, "loadgen.step")
		out, err := r.c.Step(ctx, q)
		reg.End()
		r.lat = append(r.lat, time.Since(t0))
		r.steps++
		if err != nil {
			if errors.Is(err, client.ErrRestarted) || errors.Is(err, client.ErrUnavailable) {
				// Serve restarted or ended the session: what was pending
				// is a miss; the requests go on with the next ones.
				r.restarts++
				clear(live)
				if errors.Is(err, client.ErrRestarted) {
					if aerr := r.attach(); aerr != nil {
						r.fail("re-map the slab: %v", aerr)
						return
					}
				} else {
					time.Sleep(50 * time.Millisecond)
				}
				continue
			}
			r.fail("step: %v", err)
			return
		}
		for _, e := range out.GetErrors() {
			r.fail("%s %s: %s: %s", e.GetItem(), e.GetReqId(), e.GetCode(), e.GetMessage())
		}
		for _, p := range out.GetPlacements() {
			rq := stored[p.GetReqId()]
			if rq == nil {
				r.fail("placement for %q, not stored in this step", p.GetReqId())
				continue
			}
			i := int(p.GetFirstPage())
			for _, rg := range p.GetL1Pages() {
				for pg := rg.GetStart(); pg < rg.GetStart()+rg.GetCount(); pg++ {
					if i >= len(rq.key) {
						r.fail("placement for %q past its %d pages", rq.name, len(rq.key))
						break
					}
					for k := range r.kb {
						if r.cfg.NoPayload {
							break
						}
						b, err := r.page(k, pg)
						if err != nil {
							r.fail("placement for %q: %v", rq.name, err)
							continue
						}
						host.Payload(b, rq.key[i], tiers.PayloadKind(k))
						if !r.owns(i) {
							// Another rank's page (owner lanes): this
							// rank never computes it; poison shows any
							// copy of it as wrong bytes on its owner.
							for j := range b {
								b[j] = ^b[j]
							}
						}
					}
					i++
				}
			}
		}
		for _, pl := range out.GetPlans() {
			c := &pb.Completion{Plan: pl.GetPlan(), Ok: true}
			if !r.cfg.NoCopies {
				c.Ok, c.Sums = r.runPlan(pl)
			}
			owed = append(owed, c)
		}
		for _, lr := range out.GetLookups() {
			if lr.GetStatus() != pb.LookupStatus_LOOKUP_STATUS_DONE {
				continue
			}
			rq := live[lr.GetReqId()]
			if rq == nil {
				r.fail("a result for %q, which is not pending", lr.GetReqId())
				continue
			}
			delete(live, rq.name)
			r.result(rq, lr)
			ready = append(ready, rq)
		}
	}
}

// runPlan runs one copy plan through the slab; false when an item could
// not be run. Items that continue the previous one on both sides (the
// next L1 page of the same kind, the next span of the same slab file) are
// copied as one run: a plan of many small pages costs one copy per run,
// not per page. For a plan into the slab that ran whole it returns each
// item's CRC-32C (Completion.sums), taken in the same pass as the copy
// (crc32c.CopyUpdateStream), the sum serve's tiers keep with the page;
// StoreGBps counts that pass.
func (r *rank) runPlan(pl *pb.CopyPlan) (bool, []uint32) {
	t0 := time.Now()
	var n int64
	ok := true
	toSlab := pl.GetDirection() == pb.Direction_DIRECTION_TO_SLAB
	var sums []uint32
	if toSlab {
		sums = make([]uint32, 0, len(pl.GetItems()))
	}
	var run copyRun
	r.runs = r.runs[:0]
	flush := func() {
		if run.items == 0 {
			return
		}
		sp, err := r.slab.Bytes(run.slab, run.offset, run.length)
		if err != nil {
			r.fail("plan %d: %v", pl.GetPlan(), err)
			ok = false
		} else {
			l1 := r.l1[run.kind][int64(run.page)*r.kb[run.kind] : int64(run.page)*r.kb[run.kind]+int64(run.length)]
			if toSlab {
				// One pass per page: the copy and the sum of what it
				// copied. Streaming stores, as the host pool's copy: no
				// CPU reads these slab bytes again soon (the spill writes
				// them to the disk from the slab, a load comes much
				// later); beside serve's L3 work they ran 7% faster than
				// stores through the cache (docs/perf.md).
				size := r.kb[run.kind]
				for off := int64(0); off < int64(len(sp)); off += size {
					sums = append(sums, crc32c.CopyUpdateStream(0, sp[off:off+size], l1[off:off+size]))
				}
			} else {
				copy(l1, sp)
			}
			n += int64(len(sp))
			r.runs = append(r.runs, int64(len(sp)))
		}
		r.copyRuns++
		run = copyRun{}
	}
	for _, it := range pl.GetItems() {
		kind := int(it.GetKind())
		if kind >= len(r.kb) || int64(it.GetLength()) != r.kb[kind] {
			r.fail("plan %d: item of kind %d, %d bytes", pl.GetPlan(), it.GetKind(), it.GetLength())
			ok = false
			continue
		}
		if _, err := r.page(kind, it.GetL1Page()); err != nil {
			r.fail("plan %d: %v", pl.GetPlan(), err)
			ok = false
			continue
		}
		r.copyItems++
		if !run.extends(it) {
			flush()
			run = copyRun{kind: kind, page: it.GetL1Page(), slab: it.GetSlab(), offset: it.GetOffset()}
		}
		run.length += it.GetLength()
		run.items++
	}
	flush()
	d := time.Since(t0).Nanoseconds()
	if 4*r.limit.bytes <= r.loaded+r.stored {
		// NB: a quarter of the bytes is plenty for the limit, and spares
		// the run most of its time: in lockstep every rank's next step
		// waits for this one's.
		r.limit.copy(r.runs)
	}
	if toSlab {
		r.stored += n
		r.storeNs += d
	} else {
		r.loaded += n
		r.loadNs += d
	}
	if !ok || len(sums) != len(pl.GetItems()) {
		// NB: a plan that did not run whole reports no sums (a failed
		// plan's are ignored anyway, and a count off by the items that
		// failed would be refused).
		return ok, nil
	}
	r.summed += int64(len(sums))
	return ok, sums
}

// copyRun is a run of plan items contiguous in L1 and in one slab file.
type copyRun struct {
	kind           int
	page, slab     uint32
	offset, length uint64
	items          int
}

// extends says whether it continues the run: the same kind, the next L1
// page, and the bytes right after the run's in the same slab file.
func (c copyRun) extends(it *pb.CopyItem) bool {
	return c.items > 0 && int(it.GetKind()) == c.kind && it.GetL1Page() == c.page+uint32(c.items) &&
		it.GetSlab() == c.slab && it.GetOffset() == c.offset+c.length
}

// owns reports whether the page at position i of a key is this rank's:
// with owner lanes (Register's owner_lanes above 1) page i is rank
// i mod owner_lanes's, else every page is every rank's.
func (r *rank) owns(i int) bool {
	lanes := int(r.c.Info().GetOwnerLanes())
	return control.OwnerOf(i, lanes) == control.OwnerOf(r.idx, lanes)
}

// result verifies a DONE lookup's hit pages (this rank's own, with owner
// lanes) and counts its hits.
func (r *rank) result(rq *req, lr *pb.LookupResult) {
	r.requests++
	r.input += rq.input
	i := 0
	good := 0
	for _, rg := range lr.GetL1Pages() {
		for pg := rg.GetStart(); pg < rg.GetStart()+rg.GetCount(); pg++ {
			if i >= len(rq.key) {
				r.fail("%q: %d hit pages for a key of %d", rq.name, lr.GetHitPages(), len(rq.key))
				return
			}
			same := true
			for k := range r.kb {
				if !r.owns(i) {
					break
				}
				if r.cfg.NoPayload {
					same = false
					break
				}
				b, err := r.page(k, pg)
				if err != nil {
					r.fail("%q: %v", rq.name, err)
					return
				}
				w := r.want[:r.kb[k]]
				host.Payload(w, rq.key[i], tiers.PayloadKind(k))
				if !bytes.Equal(b, w) {
					same = false
					for j := range b {
						if b[j] != w[j] {
							r.wrong++
						}
					}
				}
			}
			if same && r.owns(i) {
				r.verified++
			}
			if same || r.cfg.NoPayload {
				good++
			}
			i++
		}
	}
	if i != int(lr.GetHitPages()) {
		r.fail("%q: %d L1 pages listed for %d hit pages", rq.name, i, lr.GetHitPages())
	}
	tok := func(pages int) int64 { return min(int64(pages)*int64(workload.BlockTokens), rq.input) }
	l1 := min(int(lr.GetL1Hit()), good)
	l2 := min(int(lr.GetL2Hit()), good-l1)
	l3 := good - l1 - l2
	r.hits[1] += tok(l1)
	r.hits[2] += tok(l1+l2) - tok(l1)
	r.hits[3] += tok(l1+l2+l3) - tok(l1+l2)
}

// prefault writes one byte of every 4 KiB page of b (it is zero already),
// so the kernel backs it now rather than in the first copy through it.
func prefault(b []byte) []byte {
	for i := 0; i < len(b); i += 4096 {
		b[i] = 0
	}
	return b
}

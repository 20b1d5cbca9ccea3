package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvtier/kvtier/internal/ratelog"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/plugins"
	"github.com/kvtier/kvtier/plugins/internal/wire"
	"github.com/kvtier/kvtier/plugins/proto/storev1"
	"github.com/kvtier/kvtier/tiers"
)

// Store is a tiers.Store served by a supervised plugin process.
type Store struct {
	lifecycle[storeRPC] // mu also guards the fields below

	env      tiers.Env
	ackReady chan struct{}
	// acks locks itself; acks are pushed under mu all the same, so they
	// queue in the order the ledger settles them.
	acks tiers.AckQueue

	nextBatch tiers.BatchID
	ledger    ackLedger
	carry     tiers.StoreStats // counters of past processes and of degraded items
	// sums is what the first process answered to put_sums (protocol 1.1):
	// 1 it keeps the producer's checksums, -1 it does not, 0 not yet
	// asked. Every later process of the same (SHA-256-pinned) binary
	// must answer the same: a caller decided at open whether to check
	// the slab bytes itself (KeepsPutSums).
	sums int8
}

var (
	_ tiers.Store     = (*Store)(nil)
	_ tiers.SumKeeper = (*Store)(nil)
)

// KeepsPutSums implements tiers.SumKeeper: whether the plugin answered
// keeps_put_sums at open (protocol 1.1). A plugin of protocol 1.0 does
// not; the host then sends no sums and the plugin computes its own.
func (s *Store) KeepsPutSums() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sums == 1
}

// storeRPC is what the store keeps per plugin process.
type storeRPC struct {
	client     storev1.StoreClient
	streamDone chan struct{}    // closed when the ack pump returns
	last       tiers.StoreStats // last stats the plugin reported, under Store.mu
	// seen counts what the host itself saw of this process (get hits and
	// misses in its replies, put items sent, failed acks received), under
	// Store.mu: a process killed before it reported its stats still
	// counts.
	seen    tiers.StoreStats
	carried bool // its counters are in Store.carry (it went down)
}

// storeGen is one plugin process serving the store.
type storeGen = generation[storeRPC]

// OpenStore starts the plugin binary of spec and opens its Store v1 over
// env's slab. It refuses a binary whose SHA-256 is not spec.SHA256, a plugin
// with no common protocol version, one that fails the handshake, and one
// that cannot map the slab files; each refusal says which and why.
func OpenStore(ctx context.Context, env tiers.Env, spec PluginSpec) (*Store, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if err := env.Validate(); err != nil {
		return nil, fmt.Errorf("plugin %s: %w", spec.Name, err)
	}
	if env.Slab == nil {
		return nil, fmt.Errorf("plugin %s: store plugins need the host's slab (env.Slab is nil): %w", spec.Name, tiers.ErrInvalid)
	}
	for _, f := range env.Slab.Geometry().Slabs {
		if f.Path == "" {
			return nil, fmt.Errorf("plugin %s: slab %d has no file path, so a plugin process cannot map it; use a file-backed slab (hugetlbfs or shm): %w",
				spec.Name, f.ID, ErrNoSlabMapping)
		}
	}
	config, err := spec.configJSON()
	if err != nil {
		return nil, err
	}
	opts := spec.Options.withDefaults()
	logger := env.Logger.With("plugin", spec.Name)
	m, err := newMetrics(env.Registerer, spec.Name, "store")
	if err != nil {
		return nil, err
	}
	s := &Store{
		lifecycle: lifecycle[storeRPC]{
			role: "store", service: plugins.StoreService, errClosed: tiers.ErrClosed,
			downMsg: "store plugin down; serving misses and failed writes until it restarts",
			spec:    spec, opts: opts, config: config, logger: logger, m: m,
			rl: ratelog.New(logger, opts.LogInterval),
		},
		env:      env,
		ackReady: tiers.NewAckReady(),
	}
	s.whenDown = s.settleDown
	// The supervisor exists before the first process, which may die at
	// once; it acts only when a process goes down. Restarts keep what the
	// plugin made durable: cold start "load".
	s.sup = newSupervisor(spec.Name, opts, m, logger, s.rl, func(ctx context.Context) error { return s.startGen(ctx, tiers.ColdStartLoad) })
	if err := s.startGen(ctx, env.ColdStart); err != nil {
		s.sup.stop()
		if m.unregister != nil {
			m.unregister()
		}
		return nil, err
	}
	return s, nil
}

// startGen launches a plugin process, opens the store in it, opens the ack
// stream and installs it as the serving generation.
func (s *Store) startGen(ctx context.Context, cold tiers.ColdStart) error {
	var stream storev1.Store_AcksClient
	return s.start(ctx, func(ctx context.Context, proc *process) (*storeGen, error) {
		client := storev1.NewStoreClient(proc.conn)
		octx, cancel := context.WithTimeout(ctx, s.opts.OpenTimeout)
		defer cancel()
		reply, err := client.Open(octx, &storev1.OpenRequest{
			Name:       s.spec.Name,
			StackId:    s.env.StackID,
			Rank:       uint32(s.env.Rank),
			WorldSize:  uint32(s.env.WorldSize),
			Payload:    wire.Payload(s.env.Payload),
			Slab:       wire.Slab(s.env.Slab.Geometry()),
			ColdStart:  wire.ColdStart(cold),
			ConfigJson: s.config,
			PutSums:    true,
		})
		if err != nil {
			proc.kill()
			if status.Code(err) == codes.Unimplemented {
				return nil, fmt.Errorf("plugin %s (%s): it does not serve kvtier.store.v1 (is it an index plugin?): %w", s.spec.Name, s.spec.Path, ErrHandshake)
			}
			return nil, fmt.Errorf("plugin %s (%s): open store: %w%s", s.spec.Name, s.spec.Path, wire.CallError(err), saidSuffix(proc.notes))
		}
		if !reply.GetSlabMapped() {
			_, _ = client.Close(octx, &storev1.CloseRequest{})
			proc.kill()
			return nil, fmt.Errorf("plugin %s (%s, %s): %w: kvtier moves page bytes only through the shared slab files, never over gRPC, so a store plugin must map them at open%s",
				s.spec.Name, s.spec.Path, reply.GetImplementation(), ErrNoSlabMapping, saidSuffix(proc.notes))
		}
		keeps := reply.GetKeepsPutSums()
		s.mu.Lock()
		was := s.sums
		if was == 0 {
			s.sums = -1
			if keeps {
				s.sums = 1
			}
		}
		s.mu.Unlock()
		if was != 0 && (was == 1) != keeps {
			_, _ = client.Close(octx, &storev1.CloseRequest{})
			proc.kill()
			return nil, fmt.Errorf("plugin %s (%s, %s): keeps_put_sums is %v, its first process answered %v: %w",
				s.spec.Name, s.spec.Path, reply.GetImplementation(), keeps, was == 1, ErrHandshake)
		}
		sctx, scancel := context.WithCancel(context.Background())
		stream, err = client.Acks(sctx, &storev1.AcksRequest{})
		if err != nil {
			scancel()
			proc.kill()
			return nil, fmt.Errorf("plugin %s: open ack stream: %w", s.spec.Name, wire.CallError(err))
		}
		return &storeGen{
			impl: reply.GetImplementation(), onTeardown: scancel,
			rpc: storeRPC{client: client, streamDone: make(chan struct{})},
		}, nil
	}, func(g *storeGen) {
		go s.pumpAcks(g, stream)
		go s.watchAcks(g)
		s.logger.Info("store plugin serving", "impl", g.impl, "protocol", g.proc.version, "pid", g.proc.pid, "cold_start", string(cold))
	})
}

func saidSuffix(n *bridgeNotes) string {
	if l := n.lastLines(); l != "" {
		return " (plugin said: " + l + ")"
	}
	return ""
}

// watchAcks marks the store down when a Put item of generation g has
// waited longer than AckTimeout for its terminal ack: a plugin that stops
// acknowledging is hung even if every call still answers.
func (s *Store) watchAcks(g *storeGen) {
	t := time.NewTicker(max(s.opts.AckTimeout/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-g.stopped:
			return
		case now := <-t.C:
			s.mu.Lock()
			late, age := s.ledger.overdue(g.id, now, s.opts.AckTimeout)
			s.mu.Unlock()
			if late != 0 {
				s.fail(g, reasonTimeout, fmt.Errorf("put batch %d has items without a terminal ack after %v (ack_timeout %v)", late, age.Round(time.Millisecond), s.opts.AckTimeout))
				return
			}
		}
	}
}

// pumpAcks receives the plugin's acks until its stream ends.
func (s *Store) pumpAcks(g *storeGen, stream storev1.Store_AcksClient) {
	defer close(g.rpc.streamDone)
	for {
		msg, err := stream.Recv()
		if err != nil {
			s.mu.Lock()
			expected := g.closing || s.gen != g
			s.mu.Unlock()
			if !expected {
				s.fail(g, reasonCrash, fmt.Errorf("ack stream ended: %w", err))
			}
			return
		}
		if err := s.applyAcks(g, msg.GetAcks()); err != nil {
			s.fail(g, reasonMalformed, err)
			return
		}
	}
}

// applyAcks checks the plugin's acks against the batches it was given and
// queues them. A violation of the ack protocol is an error (malformed); the
// acks before it stand.
func (s *Store) applyAcks(g *storeGen, acks []*storev1.Ack) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.ledger.check()
	if s.gen != g && !g.closing {
		return nil // a replaced process: its acks were already synthesized
	}
	settled, err := s.ledger.apply(g.id, s.spec.Name, acks, nil)
	if len(settled) > 0 {
		var failed int64
		for _, a := range settled {
			if a.Stage == tiers.AckFailed {
				failed++
			}
		}
		s.countSeen(g, tiers.StoreStats{PutFailures: failed})
		s.acks.Push(s.ackReady, settled...)
	}
	return err
}

// failPending acknowledges AckFailed, with err, every item of generation
// gen's batches (all batches if gen < 0) that has no terminal ack yet. It
// returns the number of items. s.mu must be held.
func (s *Store) failPending(gen int, err error) int {
	failed, n := s.ledger.failPending(gen, err, nil)
	s.acks.Push(s.ackReady, failed...)
	return n
}

// fail marks generation g down: its pending put items fail, the process is
// killed, and the supervisor restarts it. It is a no-op if g is no longer
// the serving generation.
func (s *Store) fail(g *storeGen, reason string, cause error) { s.lifecycle.fail(g, reason, cause) }

// settleDown is the store's part of going down (lifecycle.whenDown, under
// s.mu): the process's counters are carried and its pending put items fail.
func (s *Store) settleDown(g *storeGen, reason string) []any {
	s.carryOver(g)
	downErr := fmt.Errorf("plugin %s %s: %w: %w", s.spec.Name, reason, ErrDown, tiers.ErrBroken)
	n := s.failPending(g.id, downErr)
	s.carry.PutFailures += int64(n)
	s.m.degraded.WithLabelValues("put").Add(float64(n))
	return []any{"failed_put_items", n}
}

// carryOver adds a finished process's counters to the carried totals; s.mu
// must be held. Counts the host saw itself make up for what the process
// did after it last reported (or if it never did); corruption and
// evictions only the plugin knows.
func (s *Store) carryOver(g *storeGen) {
	addCounters(&s.carry, processCounters(g.rpc.last, g.rpc.seen))
	g.rpc.carried = true
}

// processCounters merges what a process reported with what the host saw
// of it: each count is the larger, so Stats never goes back.
func processCounters(reported, seen tiers.StoreStats) tiers.StoreStats {
	return tiers.StoreStats{
		Hits: max(reported.Hits, seen.Hits), Misses: max(reported.Misses, seen.Misses), Corrupt: reported.Corrupt,
		Puts: max(reported.Puts, seen.Puts), PutFailures: max(reported.PutFailures, seen.PutFailures), Evictions: reported.Evictions,
	}
}

// addCounters adds the counters (not the page, byte and capacity gauges)
// of c to dst.
func addCounters(dst *tiers.StoreStats, c tiers.StoreStats) {
	dst.Hits += c.Hits
	dst.Misses += c.Misses
	dst.Corrupt += c.Corrupt
	dst.Puts += c.Puts
	dst.PutFailures += c.PutFailures
	dst.Evictions += c.Evictions
}

// countSeen adds counts the host saw of generation g: to g's own while it
// has not gone down, else (it went down meanwhile) to the carried totals.
// s.mu must be held.
func (s *Store) countSeen(g *storeGen, c tiers.StoreStats) {
	if g.rpc.carried {
		addCounters(&s.carry, c)
		return
	}
	addCounters(&g.rpc.seen, c)
}

// callFailed handles the error of a call: ErrInvalid for a refused request,
// the caller's own context error, or (after marking the plugin down) nil
// with degraded = true.
func (s *Store) callFailed(ctx context.Context, g *storeGen, method string, err error) (degraded bool, out error) {
	if ctx.Err() != nil {
		return false, fmt.Errorf("plugin %s: %s: %w", s.spec.Name, method, ctx.Err())
	}
	switch wire.Classify(err) {
	case wire.CallInvalid:
		return false, fmt.Errorf("plugin %s: %s: %w: %w", s.spec.Name, method, wire.CallError(err), tiers.ErrInvalid)
	case wire.CallTimeout:
		s.fail(g, reasonTimeout, fmt.Errorf("%s past its %v deadline", method, s.opts.CallTimeout))
	default:
		s.fail(g, reasonCrash, fmt.Errorf("%s: %w", method, err))
	}
	return true, nil
}

// checkSpan validates one item against the payload geometry and the slab,
// so a malformed batch is refused whole before any item reaches the plugin.
func (s *Store) checkSpan(what string, i int, k tiers.Key, sp tiers.Span) error {
	size, err := s.env.Payload.PageBytes(k.Kind)
	if err != nil {
		return fmt.Errorf("plugin %s: %s item %d: %w", s.spec.Name, what, i, err)
	}
	if sp.Length != size {
		return fmt.Errorf("plugin %s: %s item %d: span length %d, kind %d pages are %d bytes: %w", s.spec.Name, what, i, sp.Length, k.Kind, size, tiers.ErrInvalid)
	}
	if _, err := s.env.Slab.Bytes(sp); err != nil {
		return fmt.Errorf("plugin %s: %s item %d: %w", s.spec.Name, what, i, err)
	}
	return nil
}

// Put sends the batch to the plugin. While the plugin is down, or if it
// fails during the call, every item is acknowledged AckFailed with an error
// wrapping ErrDown and tiers.ErrBroken; the call itself succeeds.
func (s *Store) Put(ctx context.Context, batch []tiers.PutRequest) (tiers.BatchID, error) {
	for i, r := range batch {
		if err := s.checkSpan("put", i, r.Key, r.Src); err != nil {
			return 0, err
		}
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return 0, fmt.Errorf("plugin %s: %w", s.spec.Name, tiers.ErrClosed)
	}
	s.nextBatch++
	id := s.nextBatch
	g := s.gen
	sums := s.sums == 1 // every process answers as the first (startGen)
	if len(batch) == 0 {
		s.mu.Unlock()
		return id, nil
	}
	if g == nil {
		err := fmt.Errorf("plugin %s: %w: %w", s.spec.Name, ErrDown, tiers.ErrBroken)
		failed := make([]tiers.Ack, len(batch))
		for i := range batch {
			failed[i] = tiers.Ack{Batch: id, Index: i, Stage: tiers.AckFailed, Err: err}
		}
		s.carry.Puts += int64(len(batch))
		s.carry.PutFailures += int64(len(batch))
		s.acks.Push(s.ackReady, failed...)
		s.mu.Unlock()
		s.m.degraded.WithLabelValues("put").Add(float64(len(batch)))
		s.rl.Warn("degraded-put", "store plugin down: put items failed", "items", len(batch))
		return id, nil
	}
	s.ledger.open(id, g.id, len(batch), time.Now())
	s.countSeen(g, tiers.StoreStats{Puts: int64(len(batch))})
	s.mu.Unlock()

	req := &storev1.PutRequest{Batch: uint64(id), Items: make([]*storev1.PutItem, len(batch))}
	for i, r := range batch {
		req.Items[i] = &storev1.PutItem{Key: wire.StoreKey(r.Key), Src: wire.Span(r.Src)}
		if r.HasSum && sums {
			req.Items[i].Sum, req.Items[i].HasSum = r.Sum, true
		}
	}
	// Put is asynchronous and quick; it ignores the caller's cancellation,
	// because a cancelled call leaves unknown whether the plugin accepted
	// the batch, and only the plugin's acks or its failure can settle it.
	cctx, cancel := callCtx(context.WithoutCancel(ctx), s.opts)
	defer cancel()
	start := time.Now()
	_, err := g.rpc.client.Put(cctx, req)
	s.m.observe("put", start)
	if err == nil {
		return id, nil
	}
	if wire.Classify(err) == wire.CallInvalid {
		s.mu.Lock()
		pending := s.ledger.drop(id)
		s.mu.Unlock()
		if pending {
			return 0, fmt.Errorf("plugin %s: put: %w: %w", s.spec.Name, wire.CallError(err), tiers.ErrInvalid)
		}
		return id, nil // the plugin failed meanwhile and the items were acknowledged failed
	}
	_, _ = s.callFailed(ctx, g, "put", err)
	return id, nil
}

// Get reads the batch through the plugin. While the plugin is down, or if
// it fails during the call or replies malformed, every item is a miss
// wrapping tiers.ErrMiss and ErrDown; the call itself succeeds. Get ignores
// ctx's cancellation and deadline (the plugin's CallTimeout applies), as
// Put does: it returns only once the plugin has answered or can no longer
// write the destinations.
func (s *Store) Get(ctx context.Context, batch []tiers.GetRequest, results []error) error {
	if len(results) != len(batch) {
		return fmt.Errorf("plugin %s: get: %d results for %d items: %w", s.spec.Name, len(results), len(batch), tiers.ErrInvalid)
	}
	for i, r := range batch {
		if err := s.checkSpan("get", i, r.Key, r.Dst); err != nil {
			return err
		}
	}
	g, err := s.serving()
	if err != nil {
		return err
	}
	if len(batch) == 0 {
		return nil
	}
	if g == nil {
		s.missAll(results, "down")
		return nil
	}
	req := &storev1.GetRequest{Items: make([]*storev1.GetItem, len(batch))}
	for i, r := range batch {
		req.Items[i] = &storev1.GetItem{Key: wire.StoreKey(r.Key), Dst: wire.Span(r.Dst)}
	}
	// NB: the call ignores the caller's cancellation and deadline: the
	// plugin may write the destinations until it answers, so Get returns
	// only after its answer or, past CallTimeout, once its process group
	// is dead (callFailed). Returning at a shorter caller deadline would
	// hand back destinations that a slow plugin still writes.
	uctx := context.WithoutCancel(ctx)
	cctx, cancel := callCtx(uctx, s.opts)
	defer cancel()
	start := time.Now()
	reply, err := g.rpc.client.Get(cctx, req)
	s.m.observe("get", start)
	if err != nil {
		if _, err := s.callFailed(uctx, g, "get", err); err != nil {
			return err
		}
		s.missAll(results, "failed during get")
		return nil
	}
	if err := s.decodeGet(reply, results); err != nil {
		s.fail(g, reasonMalformed, fmt.Errorf("get reply: %w", err))
		s.missAll(results, "malformed get reply")
		return nil
	}
	var seen tiers.StoreStats
	for _, r := range results {
		if r == nil {
			seen.Hits++
		} else {
			seen.Misses++
		}
	}
	s.mu.Lock()
	s.countSeen(g, seen)
	s.mu.Unlock()
	return nil
}

// decodeGet fills results from a reply, or fails without touching them.
func (s *Store) decodeGet(reply *storev1.GetReply, results []error) error {
	rs := reply.GetResults()
	if len(rs) != len(results) {
		return fmt.Errorf("%d results for %d items: %w", len(rs), len(results), wire.ErrMalformed)
	}
	decoded := make([]error, len(rs))
	for i, r := range rs {
		itemErr, err := wire.FromResult(r.GetCode(), r.GetMessage())
		if err != nil {
			return fmt.Errorf("item %d: %w", i, err)
		}
		if itemErr != nil && !errors.Is(itemErr, tiers.ErrMiss) {
			// The contract allows only hits and misses per get item;
			// anything else is still never a hit.
			itemErr = fmt.Errorf("%w: %w", tiers.ErrMiss, itemErr)
		}
		if itemErr != nil {
			itemErr = fmt.Errorf("plugin %s: %w", s.spec.Name, itemErr)
		}
		decoded[i] = itemErr
	}
	copy(results, decoded)
	return nil
}

// missAll makes every result a miss for a down plugin and counts it.
func (s *Store) missAll(results []error, why string) {
	err := fmt.Errorf("plugin %s %s: %w: %w", s.spec.Name, why, tiers.ErrMiss, ErrDown)
	for i := range results {
		results[i] = err
	}
	s.mu.Lock()
	s.carry.Misses += int64(len(results))
	s.mu.Unlock()
	s.m.degraded.WithLabelValues("get").Add(float64(len(results)))
	s.rl.Warn("degraded-get", "store plugin down: get items are misses", "items", len(results))
}

// LongestPrefix asks the plugin; while it is down the answer is 0.
func (s *Store) LongestPrefix(ctx context.Context, kind tiers.PayloadKind, chain []pagehash.Hash) (int, error) {
	if _, err := s.env.Payload.PageBytes(kind); err != nil {
		return 0, fmt.Errorf("plugin %s: longest prefix: %w", s.spec.Name, err)
	}
	g, err := s.serving()
	if err != nil {
		return 0, err
	}
	if len(chain) == 0 {
		return 0, nil
	}
	if g == nil {
		s.m.degraded.WithLabelValues("prefix").Inc()
		return 0, nil
	}
	req := &storev1.LongestPrefixRequest{Kind: uint32(kind), Chain: make([][]byte, len(chain))}
	for i := range chain {
		req.Chain[i] = chain[i][:]
	}
	cctx, cancel := callCtx(ctx, s.opts)
	defer cancel()
	start := time.Now()
	reply, err := g.rpc.client.LongestPrefix(cctx, req)
	s.m.observe("longest_prefix", start)
	if err != nil {
		if _, err := s.callFailed(ctx, g, "longest prefix", err); err != nil {
			return 0, err
		}
		s.m.degraded.WithLabelValues("prefix").Inc()
		return 0, nil
	}
	if int64(reply.GetPresent()) > int64(len(chain)) {
		s.fail(g, reasonMalformed, fmt.Errorf("longest prefix %d of a chain of %d: %w", reply.GetPresent(), len(chain), wire.ErrMalformed))
		return 0, nil
	}
	return int(reply.GetPresent()), nil
}

// Delete removes keys in the plugin. While the plugin is down it fails
// with an error wrapping ErrDown and tiers.ErrBroken: the keys may still be
// present when the plugin comes back (a later get verifies what it reads).
func (s *Store) Delete(ctx context.Context, keys []tiers.Key) error {
	return s.keysCall(ctx, "delete", keys, func(ctx context.Context, g *storeGen, ks []*storev1.Key) error {
		_, err := g.rpc.client.Delete(ctx, &storev1.DeleteRequest{Keys: ks})
		return err
	}, true)
}

// Touch marks keys used in the plugin; while it is down it is skipped.
func (s *Store) Touch(ctx context.Context, keys []tiers.Key) error {
	return s.keysCall(ctx, "touch", keys, func(ctx context.Context, g *storeGen, ks []*storev1.Key) error {
		_, err := g.rpc.client.Touch(ctx, &storev1.TouchRequest{Keys: ks})
		return err
	}, false)
}

func (s *Store) keysCall(ctx context.Context, method string, keys []tiers.Key, call func(context.Context, *storeGen, []*storev1.Key) error, reportDown bool) error {
	for i, k := range keys {
		if _, err := s.env.Payload.PageBytes(k.Kind); err != nil {
			return fmt.Errorf("plugin %s: %s key %d: %w", s.spec.Name, method, i, err)
		}
	}
	g, err := s.serving()
	if err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	down := func() error {
		s.m.degraded.WithLabelValues(method).Add(float64(len(keys)))
		if reportDown {
			return fmt.Errorf("plugin %s: %s of %d keys: %w: %w", s.spec.Name, method, len(keys), ErrDown, tiers.ErrBroken)
		}
		return nil
	}
	if g == nil {
		return down()
	}
	cctx, cancel := callCtx(ctx, s.opts)
	defer cancel()
	start := time.Now()
	err = call(cctx, g, wire.StoreKeys(keys))
	s.m.observe(method, start)
	if err == nil {
		return nil
	}
	if _, err := s.callFailed(ctx, g, method, err); err != nil {
		return err
	}
	return down()
}

// DrainAcks appends the queued acks to dst.
func (s *Store) DrainAcks(dst []tiers.Ack) []tiers.Ack {
	return s.acks.Drain(dst)
}

// AckReady is signalled when acks were queued.
func (s *Store) AckReady() <-chan struct{} { return s.ackReady }

// Stats returns the plugin's counters plus those of the processes before
// it and the items served degraded: cumulative across crashes and
// restarts. For every process the hit, miss, put and put-failure counts
// are the larger of what it reported and what the host saw in its replies
// and acks, so a process killed before it reported still counts (corrupt
// and eviction counts only the plugin knows). Page and byte counts are the
// serving process's (0 while down).
func (s *Store) Stats() tiers.StoreStats {
	g, err := s.serving()
	var cur tiers.StoreStats
	if err == nil && g != nil {
		ctx, cancel := callCtx(context.Background(), s.opts)
		reply, rerr := g.rpc.client.Stats(ctx, &storev1.StatsRequest{})
		cancel()
		if rerr != nil {
			_, _ = s.callFailed(context.Background(), g, "stats", rerr)
		} else if st, derr := wire.FromStats(reply); derr != nil {
			s.fail(g, reasonMalformed, derr)
		} else {
			s.mu.Lock()
			if s.gen == g {
				g.rpc.last = st
				cur = st
			}
			s.mu.Unlock()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.carry
	if s.gen != nil && s.gen == g {
		addCounters(&out, processCounters(cur, g.rpc.seen))
		out.Pages, out.Bytes, out.CapacityBytes = cur.Pages, cur.Bytes, cur.CapacityBytes
	}
	return out
}

// Close closes the plugin's store (its last acks arrive first), stops the
// restarter and ends the process. Items still without a terminal ack are
// acknowledged AckFailed with tiers.ErrClosed.
func (s *Store) Close() error {
	return s.close(func(ctx context.Context, g *storeGen) error {
		var err error
		if _, cerr := g.rpc.client.Close(ctx, &storev1.CloseRequest{}); cerr != nil {
			err = fmt.Errorf("plugin %s: close: %w", s.spec.Name, wire.CallError(cerr))
		} else {
			select {
			case <-g.rpc.streamDone:
			case <-ctx.Done():
			}
		}
		return err
	}, func() {
		s.failPending(-1, fmt.Errorf("plugin %s: %w", s.spec.Name, tiers.ErrClosed))
	})
}

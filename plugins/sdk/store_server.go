package sdk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/plugins/internal/wire"
	"github.com/kvtier/kvtier/plugins/proto/storev1"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l2hugetlb"
)

// closeAckWait bounds how long Close waits for the ack stream to deliver
// the final acks before it returns anyway.
const closeAckWait = 5 * time.Second

// storeServer serves one tiers.Store as kvtier.store.v1.Store.
type storeServer struct {
	storev1.UnimplementedStoreServer
	p      Plugin
	logger *slog.Logger

	mu       sync.Mutex
	store    tiers.Store
	slab     tiers.Slab
	kinds    int
	sums     bool // protocol 1.1: the host sends PutItem.sum and the store keeps it
	closed   bool
	closing  chan struct{} // closed by Close: the ack stream sends what is left and ends
	streamed bool          // an Acks stream has been opened
	pumpDone chan struct{} // closed when the Acks stream ends

	// acks translates the store's batch ids to the host's and queues the
	// translated acks for the stream.
	acks *ackRelay
}

func newStoreServer(p Plugin, logger *slog.Logger) *storeServer {
	return &storeServer{
		p: p, logger: logger,
		closing:  make(chan struct{}),
		pumpDone: make(chan struct{}),
		acks:     newAckRelay(),
	}
}

// open returns the opened store, or a FAILED_PRECONDITION status.
func (s *storeServer) open() (tiers.Store, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return nil, 0, status.Error(codes.FailedPrecondition, "store plugin: "+tiers.ErrClosed.Error())
	case s.store == nil:
		return nil, 0, status.Error(codes.FailedPrecondition, "store plugin: not open")
	}
	return s.store, s.kinds, nil
}

// Open maps the slab and opens the store.
func (s *storeServer) Open(ctx context.Context, req *storev1.OpenRequest) (*storev1.OpenReply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.store != nil || s.closed {
		return nil, status.Error(codes.FailedPrecondition, "store plugin: Open called twice")
	}
	payload, err := wire.FromPayload(req.GetPayload())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "store plugin open: %v", err)
	}
	geom, err := wire.FromSlab(req.GetSlab())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "store plugin open: %v", err)
	}
	cold, err := wire.FromColdStart(req.GetColdStart())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "store plugin open: %v", err)
	}
	// The host's slab is an l2hugetlb slab: attach by path, holding its
	// stack lock shared so a new host never reuses files we have mapped.
	slab, err := l2hugetlb.Attach(ctx, s.logger, geom)
	if err != nil {
		// The host refuses a store that cannot map the slab; say so
		// rather than fail the call, so its message is the clear one.
		s.logger.Error("cannot map the host's slab files", "error", err)
		return &storev1.OpenReply{SlabMapped: false, Implementation: s.impl()}, nil
	}
	logger := s.logger.With("tier", req.GetName())
	env := tiers.Env{
		Logger:    logger,
		Payload:   payload,
		Rank:      int(req.GetRank()),
		WorldSize: int(req.GetWorldSize()),
		StackID:   req.GetStackId(),
		Slab:      slab,
		ColdStart: cold,
	}
	if err := env.Validate(); err != nil {
		slab.Close()
		return nil, status.Errorf(codes.InvalidArgument, "store plugin open: %v", err)
	}
	store, err := s.p.OpenStore(ctx, env, req.GetConfigJson())
	if err != nil {
		slab.Close()
		return nil, status.Errorf(codes.Internal, "open store %s: %v", s.p.Name, err)
	}
	s.store, s.slab, s.kinds = store, slab, len(payload.Kinds)
	// Protocol 1.1: the producer's checksums are taken only by a store
	// that keeps them as given (tiers.SumKeeper).
	if k, ok := store.(tiers.SumKeeper); ok && req.GetPutSums() && k.KeepsPutSums() {
		s.sums = true
	}
	logger.Info("store plugin open", "slabs", len(geom.Slabs), "backing", geom.Backing, "cold_start", string(cold), "keeps_put_sums", s.sums)
	return &storev1.OpenReply{SlabMapped: true, Implementation: s.impl(), KeepsPutSums: s.sums}, nil
}

func (s *storeServer) impl() string {
	if s.p.Version == "" {
		return s.p.Name
	}
	return s.p.Name + " " + s.p.Version
}

// Put starts a batch and records the host's id for it.
func (s *storeServer) Put(ctx context.Context, req *storev1.PutRequest) (*storev1.PutReply, error) {
	store, kinds, err := s.open()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	sums := s.sums
	s.mu.Unlock()
	batch := make([]tiers.PutRequest, len(req.GetItems()))
	for i, it := range req.GetItems() {
		k, err := wire.FromStoreKey(it.GetKey(), kinds)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "put item %d: %v", i, err)
		}
		sp, err := wire.FromSpan(it.GetSrc())
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "put item %d: %v", i, err)
		}
		batch[i] = tiers.PutRequest{Key: k, Src: sp}
		if it.GetHasSum() {
			if !sums {
				return nil, status.Errorf(codes.InvalidArgument, "put item %d: a sum, but this plugin did not answer keeps_put_sums", i)
			}
			batch[i].Sum, batch[i].HasSum = it.GetSum(), true
		}
	}
	id, err := store.Put(ctx, batch)
	if err != nil {
		return nil, wire.StoreStatus(fmt.Errorf("put batch %d: %w", req.GetBatch(), err))
	}
	s.acks.bind(id, req.GetBatch(), len(batch))
	return &storev1.PutReply{}, nil
}

// Get reads a batch into slab spans.
func (s *storeServer) Get(ctx context.Context, req *storev1.GetRequest) (*storev1.GetReply, error) {
	store, kinds, err := s.open()
	if err != nil {
		return nil, err
	}
	batch := make([]tiers.GetRequest, len(req.GetItems()))
	for i, it := range req.GetItems() {
		k, err := wire.FromStoreKey(it.GetKey(), kinds)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "get item %d: %v", i, err)
		}
		sp, err := wire.FromSpan(it.GetDst())
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "get item %d: %v", i, err)
		}
		batch[i] = tiers.GetRequest{Key: k, Dst: sp}
	}
	results := make([]error, len(batch))
	if err := store.Get(ctx, batch, results); err != nil {
		return nil, wire.StoreStatus(err)
	}
	reply := &storev1.GetReply{Results: make([]*storev1.ItemResult, len(results))}
	for i, r := range results {
		reply.Results[i] = wire.Result(r)
	}
	return reply, nil
}

// LongestPrefix probes a chain.
func (s *storeServer) LongestPrefix(ctx context.Context, req *storev1.LongestPrefixRequest) (*storev1.LongestPrefixReply, error) {
	store, kinds, err := s.open()
	if err != nil {
		return nil, err
	}
	kind, err := wire.Kind(req.GetKind(), kinds)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "longest prefix: %v", err)
	}
	chain := make([]pagehash.Hash, len(req.GetChain()))
	for i, b := range req.GetChain() {
		if chain[i], err = wire.Hash(b); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "longest prefix: chain[%d]: %v", i, err)
		}
	}
	n, err := store.LongestPrefix(ctx, tiers.PayloadKind(kind), chain)
	if err != nil {
		return nil, wire.StoreStatus(err)
	}
	return &storev1.LongestPrefixReply{Present: uint32(n)}, nil
}

// Delete removes keys.
func (s *storeServer) Delete(ctx context.Context, req *storev1.DeleteRequest) (*storev1.DeleteReply, error) {
	store, kinds, err := s.open()
	if err != nil {
		return nil, err
	}
	keys, err := wire.FromStoreKeys(req.GetKeys(), kinds)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "delete: %v", err)
	}
	if err := store.Delete(ctx, keys); err != nil {
		return nil, wire.StoreStatus(err)
	}
	return &storev1.DeleteReply{}, nil
}

// Touch marks keys used.
func (s *storeServer) Touch(ctx context.Context, req *storev1.TouchRequest) (*storev1.TouchReply, error) {
	store, kinds, err := s.open()
	if err != nil {
		return nil, err
	}
	keys, err := wire.FromStoreKeys(req.GetKeys(), kinds)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "touch: %v", err)
	}
	if err := store.Touch(ctx, keys); err != nil {
		return nil, wire.StoreStatus(err)
	}
	return &storev1.TouchReply{}, nil
}

// Stats returns the store's counters.
func (s *storeServer) Stats(context.Context, *storev1.StatsRequest) (*storev1.StatsReply, error) {
	store, _, err := s.open()
	if err != nil {
		return nil, err
	}
	return wire.Stats(store.Stats()), nil
}

// Acks relays the store's acks until Close or until the host goes away.
func (s *storeServer) Acks(_ *storev1.AcksRequest, stream storev1.Store_AcksServer) error {
	store, _, err := s.open()
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.streamed {
		s.mu.Unlock()
		return status.Error(codes.FailedPrecondition, "store plugin: the ack stream is already open")
	}
	s.streamed = true
	s.mu.Unlock()
	defer close(s.pumpDone)

	var raw []tiers.Ack
	send := func() error {
		raw = store.DrainAcks(raw[:0])
		out := s.acks.translate(raw, s.logger)
		if len(out) == 0 {
			return nil
		}
		return stream.Send(&storev1.AckBatch{Acks: out})
	}
	for {
		if err := send(); err != nil {
			return err
		}
		select {
		case <-store.AckReady():
		case <-s.acks.ready:
		case <-stream.Context().Done():
			return nil
		case <-s.closing:
			// Close has closed the store: its last acks (ErrClosed for
			// items not yet durable) are queued now. Send them and end.
			return send()
		}
	}
}

// Close closes the store, lets the ack stream deliver its last acks, and
// unmaps the slab.
func (s *storeServer) Close(context.Context, *storev1.CloseRequest) (*storev1.CloseReply, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return &storev1.CloseReply{}, nil
	}
	s.closed = true
	store, slab, streamed := s.store, s.slab, s.streamed
	s.mu.Unlock()
	var err error
	if store != nil {
		err = store.Close()
	}
	close(s.closing)
	if streamed {
		select {
		case <-s.pumpDone:
		case <-time.After(closeAckWait):
			s.logger.Warn("ack stream did not finish within the close deadline", "wait", closeAckWait)
		}
	}
	if slab != nil {
		err = errors.Join(err, slab.Close())
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "close store %s: %v", s.p.Name, err)
	}
	return &storev1.CloseReply{}, nil
}

// shutdown closes the store if the host never did.
func (s *storeServer) shutdown() {
	if _, err := s.Close(context.Background(), &storev1.CloseRequest{}); err != nil {
		s.logger.Error("close store at exit", "error", err)
	}
}

// ackRelay maps the store's batch ids to the host's. Put binds an id after
// store.Put returns, but the store may ack the batch before that, so acks of
// a not-yet-bound batch wait in pending; bind releases them.
type ackRelay struct {
	mu      sync.Mutex
	batches map[tiers.BatchID]*relayBatch
	pending map[tiers.BatchID][]tiers.Ack
	outbox  []*storev1.Ack
	ready   chan struct{}
}

type relayBatch struct {
	host uint64
	left int // items without a terminal ack yet
}

func newAckRelay() *ackRelay {
	return &ackRelay{
		batches: make(map[tiers.BatchID]*relayBatch),
		pending: make(map[tiers.BatchID][]tiers.Ack),
		ready:   make(chan struct{}, 1),
	}
}

// bind records that store batch id is host batch host of n items.
func (r *ackRelay) bind(id tiers.BatchID, host uint64, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n == 0 {
		return
	}
	b := &relayBatch{host: host, left: n}
	r.batches[id] = b
	if early := r.pending[id]; len(early) > 0 {
		delete(r.pending, id)
		for _, a := range early {
			r.outbox = append(r.outbox, r.convert(id, b, a))
		}
		select {
		case r.ready <- struct{}{}:
		default:
		}
	}
}

// translate converts drained acks, returning those ready to send.
func (r *ackRelay) translate(acks []tiers.Ack, logger *slog.Logger) []*storev1.Ack {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range acks {
		b, ok := r.batches[a.Batch]
		if !ok {
			r.pending[a.Batch] = append(r.pending[a.Batch], a)
			continue
		}
		r.outbox = append(r.outbox, r.convert(a.Batch, b, a))
	}
	if len(r.pending) > 1024 {
		logger.Warn("store acks for batches no Put returned", "batches", len(r.pending))
	}
	out := r.outbox
	r.outbox = nil
	return out
}

func (r *ackRelay) convert(id tiers.BatchID, b *relayBatch, a tiers.Ack) *storev1.Ack {
	out := &storev1.Ack{Batch: b.host, Index: uint32(a.Index), Stage: wire.AckStage(a.Stage), Code: storev1.ResultCode_RESULT_CODE_OK}
	if a.Stage == tiers.AckFailed {
		err := a.Err
		if err == nil {
			err = errors.New("put failed")
		}
		out.Code, out.Message = wire.ResultCode(err), err.Error()
		if out.Code == storev1.ResultCode_RESULT_CODE_OK || out.Code == storev1.ResultCode_RESULT_CODE_MISS {
			out.Code = storev1.ResultCode_RESULT_CODE_FAILED
		}
	}
	if a.Stage == tiers.AckDurable || a.Stage == tiers.AckFailed {
		if b.left--; b.left <= 0 {
			delete(r.batches, id)
		}
	}
	return out
}

package sdk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/plugins/internal/wire"
	"github.com/kvtier/kvtier/plugins/proto/indexv1"
)

// Iterate batch sizes: the default, and the most a host may ask for.
const (
	defaultIterateBatch = 1024
	maxIterateBatch     = 64 << 10
)

// indexServer serves one indexes.Index as kvtier.index.v1.Index.
type indexServer struct {
	indexv1.UnimplementedIndexServer
	p      Plugin
	logger *slog.Logger

	mu     sync.Mutex
	index  indexes.Index
	closed bool
}

func newIndexServer(p Plugin, logger *slog.Logger) *indexServer {
	return &indexServer{p: p, logger: logger}
}

func (s *indexServer) open() (indexes.Index, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return nil, status.Error(codes.FailedPrecondition, "index plugin: "+indexes.ErrClosed.Error())
	case s.index == nil:
		return nil, status.Error(codes.FailedPrecondition, "index plugin: not open")
	}
	return s.index, nil
}

// Open opens the index.
func (s *indexServer) Open(ctx context.Context, req *indexv1.OpenRequest) (*indexv1.OpenReply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.index != nil || s.closed {
		return nil, status.Error(codes.FailedPrecondition, "index plugin: Open called twice")
	}
	logger := s.logger.With("index", req.GetName())
	idx, err := s.p.OpenIndex(ctx, indexes.Env{Logger: logger, Dir: req.GetDir()}, req.GetConfigJson())
	if err != nil {
		return nil, wire.IndexStatus(fmt.Errorf("open index %s: %w", s.p.Name, err))
	}
	s.index = idx
	logger.Info("index plugin open", "dir", req.GetDir())
	impl := s.p.Name
	if s.p.Version != "" {
		impl += " " + s.p.Version
	}
	return &indexv1.OpenReply{Implementation: impl}, nil
}

// Put writes entries.
func (s *indexServer) Put(ctx context.Context, req *indexv1.PutRequest) (*indexv1.PutReply, error) {
	idx, err := s.open()
	if err != nil {
		return nil, err
	}
	es, err := wire.FromEntries(req.GetEntries())
	if err != nil {
		return nil, wire.IndexStatus(fmt.Errorf("index put: %w", err))
	}
	if err := idx.Put(ctx, es); err != nil {
		return nil, wire.IndexStatus(err)
	}
	return &indexv1.PutReply{}, nil
}

// Get looks keys up.
func (s *indexServer) Get(ctx context.Context, req *indexv1.GetRequest) (*indexv1.GetReply, error) {
	idx, err := s.open()
	if err != nil {
		return nil, err
	}
	keys, err := wire.FromIndexKeys(req.GetKeys())
	if err != nil {
		return nil, wire.IndexStatus(fmt.Errorf("index get: %w", err))
	}
	recs := make([]indexes.Record, len(keys))
	found := make([]bool, len(keys))
	if err := idx.Get(ctx, keys, recs, found); err != nil {
		return nil, wire.IndexStatus(err)
	}
	reply := &indexv1.GetReply{Results: make([]*indexv1.Lookup, len(keys))}
	for i := range keys {
		l := &indexv1.Lookup{Found: found[i]}
		if found[i] {
			l.Record = wire.Record(recs[i])
		}
		reply.Results[i] = l
	}
	return reply, nil
}

// Delete removes keys.
func (s *indexServer) Delete(ctx context.Context, req *indexv1.DeleteRequest) (*indexv1.DeleteReply, error) {
	idx, err := s.open()
	if err != nil {
		return nil, err
	}
	keys, err := wire.FromIndexKeys(req.GetKeys())
	if err != nil {
		return nil, wire.IndexStatus(fmt.Errorf("index delete: %w", err))
	}
	if err := idx.Delete(ctx, keys); err != nil {
		return nil, wire.IndexStatus(err)
	}
	return &indexv1.DeleteReply{}, nil
}

// DeleteIf removes keys whose records still match.
func (s *indexServer) DeleteIf(ctx context.Context, req *indexv1.DeleteIfRequest) (*indexv1.DeleteIfReply, error) {
	idx, err := s.open()
	if err != nil {
		return nil, err
	}
	es, err := wire.FromEntries(req.GetEntries())
	if err != nil {
		return nil, wire.IndexStatus(fmt.Errorf("index delete-if: %w", err))
	}
	deleted := make([]bool, len(es))
	if err := idx.DeleteIf(ctx, es, deleted); err != nil {
		return nil, wire.IndexStatus(err)
	}
	return &indexv1.DeleteIfReply{Deleted: deleted}, nil
}

// Touch sets last access times.
func (s *indexServer) Touch(ctx context.Context, req *indexv1.TouchRequest) (*indexv1.TouchReply, error) {
	idx, err := s.open()
	if err != nil {
		return nil, err
	}
	keys, err := wire.FromIndexKeys(req.GetKeys())
	if err != nil {
		return nil, wire.IndexStatus(fmt.Errorf("index touch: %w", err))
	}
	if err := idx.Touch(ctx, keys, req.GetAt()); err != nil {
		return nil, wire.IndexStatus(err)
	}
	return &indexv1.TouchReply{}, nil
}

// Iterate streams entries in key order.
func (s *indexServer) Iterate(req *indexv1.IterateRequest, stream indexv1.Index_IterateServer) error {
	idx, err := s.open()
	if err != nil {
		return err
	}
	size := int(req.GetBatchSize())
	if size <= 0 {
		size = defaultIterateBatch
	}
	size = min(size, maxIterateBatch)
	buf := make([]indexes.Entry, 0, size)
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		err := stream.Send(&indexv1.IterateBatch{Entries: wire.Entries(buf)})
		buf = buf[:0]
		return err
	}
	err = idx.Iterate(stream.Context(), func(e indexes.Entry) error {
		buf = append(buf, e)
		if len(buf) == size {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return status.Error(codes.Canceled, err.Error())
		}
		return wire.IndexStatus(err)
	}
	return nil
}

// Stats returns counters.
func (s *indexServer) Stats(ctx context.Context, _ *indexv1.StatsRequest) (*indexv1.StatsReply, error) {
	idx, err := s.open()
	if err != nil {
		return nil, err
	}
	st, err := idx.Stats(ctx)
	if err != nil {
		return nil, wire.IndexStatus(err)
	}
	return &indexv1.StatsReply{Entries: st.Entries, Bytes: st.Bytes, CapacityBytes: st.CapacityBytes}, nil
}

// Close releases the index.
func (s *indexServer) Close(context.Context, *indexv1.CloseRequest) (*indexv1.CloseReply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &indexv1.CloseReply{}, nil
	}
	s.closed = true
	if s.index == nil {
		return &indexv1.CloseReply{}, nil
	}
	if err := s.index.Close(); err != nil {
		return nil, status.Errorf(codes.Internal, "close index %s: %v", s.p.Name, err)
	}
	return &indexv1.CloseReply{}, nil
}

func (s *indexServer) shutdown() {
	if _, err := s.Close(context.Background(), &indexv1.CloseRequest{}); err != nil {
		s.logger.Error("close index at exit", "error", err)
	}
}

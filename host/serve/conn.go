package serve

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc/stats"
)

// connKey tags a server connection's context with its number, so a
// Register knows which connection its session lives on.
type connKey struct{}

// connTracker numbers connections and reports their end: a client that
// disconnects has its sessions ended (owed plans failed and rolled back
// at the next frontier), without waiting for the session TTL.
type connTracker struct {
	s    *Server
	next atomic.Uint64
}

func (c *connTracker) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connKey{}, c.next.Add(1))
}

func (c *connTracker) HandleConn(ctx context.Context, st stats.ConnStats) {
	if _, ok := st.(*stats.ConnEnd); !ok {
		return
	}
	if id, ok := ctx.Value(connKey{}).(uint64); ok {
		c.s.connEnded(id)
	}
}

func (c *connTracker) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (c *connTracker) HandleRPC(context.Context, stats.RPCStats) {}

func connOf(ctx context.Context) uint64 {
	id, _ := ctx.Value(connKey{}).(uint64)
	return id
}

// connEnded ends every session registered over connection id.
func (s *Server) connEnded(id uint64) {
	if id == 0 {
		return
	}
	if s.store != nil {
		s.store.door.ConnEnded(id)
	}
	s.mu.Lock()
	var ends []string
	for sid, c := range s.conns {
		if c == id {
			ends = append(ends, sid)
			delete(s.conns, sid)
		}
	}
	ctx := s.live
	s.mu.Unlock()
	if ctx == nil {
		return
	}
	for _, sid := range ends {
		r := s.rankOf(sid)
		if r == nil {
			continue
		}
		go func() {
			_, _ = s.call(ctx, r, call{kind: callDrop, drop: &closeMsg{session: sid, why: "disconnected"}})
		}()
	}
}

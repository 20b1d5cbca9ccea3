package serve

import (
	"context"
	"errors"
	"fmt"
	"runtime/trace"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/internal/nsdigest"
)

func (s *Server) bind(id string, r *rank) {
	s.mu.Lock()
	s.sessions[id] = r
	s.mu.Unlock()
}

// unbind forgets session id, remembering (bounded) why it ended for a
// later Step or Close that names it.
func (s *Server) unbind(id, why string) {
	s.mu.Lock()
	delete(s.sessions, id)
	delete(s.conns, id)
	if s.ended == nil {
		s.ended = map[string]string{}
	}
	if len(s.endedOrder) == maxEnded {
		delete(s.ended, s.endedOrder[0])
		s.endedOrder = s.endedOrder[1:]
	}
	s.ended[id] = why
	s.endedOrder = append(s.endedOrder, id)
	s.mu.Unlock()
}

// maxEnded bounds the sessions whose end serve remembers.
const maxEnded = 256

// endedWhy returns why session id ended, or "" when serve does not know.
func (s *Server) endedWhy(id string) string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.ended[id]
}

func (s *Server) rankOf(id string) *rank {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.sessions[id]
}

func (s *Server) sessionCount() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.sessions)
}

// registerReply describes the rank's slab, kinds and limits.
func (s *Server) registerReply(r *rank, ses *session) *pb.RegisterReply {
	g := r.st.Slab.Geometry()
	sg := &pb.SlabGeometry{PageSize: uint64(g.PageSize), Backing: g.Backing}
	for _, f := range g.Slabs {
		sg.Files = append(sg.Files, &pb.SlabFile{Id: uint32(f.ID), Path: f.Path, Size: uint64(f.Size)})
	}
	out := &pb.RegisterReply{Session: ses.id, BootId: s.boot, ProtocolVersion: 1, Slab: sg,
		Limits: &pb.Limits{L1Pages: uint32(r.st.Pool.Geometry().Pages), MaxPagesPerRequest: uint32(s.cfg.MaxPagesPerRequest),
			MaxItemsPerStep: uint32(s.cfg.MaxItemsPerStep), SessionTtlMs: uint32(s.cfg.SessionTTL / time.Millisecond)},
		NamespaceId: append([]byte(nil), ses.keyer[:]...), GroupTransport: s.transport(), OwnerLanes: uint32(s.lanes())}
	for _, k := range r.st.Config.Payload.Kinds {
		out.Kinds = append(out.Kinds, &pb.PayloadKind{Name: k.Name, PageBytes: uint64(k.PageBytes)})
	}
	return out
}

// transport names the group transport for RegisterReply.
func (s *Server) transport() string {
	if s.cfg.Group == GroupInproc && s.cfg.Ranks == 1 {
		return "solo"
	}
	return s.cfg.Group
}

// call hands c to rank r's goroutine and waits for its answer.
func (s *Server) call(ctx context.Context, r *rank, c call) (callReply, error) {
	c.reply = make(chan callReply, 1)
	select {
	case r.calls <- c:
	case <-ctx.Done():
		return callReply{}, status.FromContextError(ctx.Err()).Err()
	}
	// The rank finishes the call even if the caller left: a step's state
	// change is whole or not at all.
	select {
	case out := <-c.reply:
		return out, nil
	case <-ctx.Done():
		return callReply{}, status.FromContextError(ctx.Err()).Err()
	}
}

// Register opens a session on the rank the request names.
func (s *Server) Register(ctx context.Context, q *pb.RegisterRequest) (*pb.RegisterReply, error) {
	if ws := int(q.GetWorldSize()); ws != s.world() {
		return nil, status.Errorf(codes.InvalidArgument, "world_size: %d, this serve's group has %d ranks", q.GetWorldSize(), s.world())
	}
	first := s.groupRank(0)
	if int(q.GetRank()) < first || int(q.GetRank()) >= first+len(s.ranks) {
		return nil, status.Errorf(codes.InvalidArgument, "rank: %d, this serve hosts ranks %d..%d", q.GetRank(), first, first+len(s.ranks)-1)
	}
	if len(q.GetProtocolVersions()) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "protocol_versions: empty; list the versions the client speaks (this serve speaks 1)")
	}
	if vs := q.GetProtocolVersions(); !containsV1(vs) {
		return nil, status.Errorf(codes.FailedPrecondition, "protocol_versions: %v, this serve speaks 1", vs)
	}
	if len(q.GetEngineId()) > nsdigest.MaxString {
		return nil, status.Errorf(codes.InvalidArgument, "engine_id: %d bytes, at most %d", len(q.GetEngineId()), nsdigest.MaxString)
	}
	out, err := s.call(ctx, s.ranks[int(q.GetRank())-first], call{kind: callRegister, reg: q})
	if err != nil {
		return nil, err
	}
	if errors.Is(out.err, errBroken) {
		return nil, status.Errorf(codes.Unavailable, "%v", out.err)
	}
	if out.err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v", out.err)
	}
	if id := connOf(ctx); id != 0 {
		s.mu.Lock()
		s.conns[out.reg.Session] = id
		s.mu.Unlock()
	}
	return out.reg, nil
}

func containsV1(vs []uint32) bool {
	for _, v := range vs {
		if v == 1 {
			return true
		}
	}
	return false
}

// Step runs one scheduler step of a session.
func (s *Server) Step(ctx context.Context, q *pb.StepRequest) (*pb.StepReply, error) {
	r := s.rankOf(q.GetSession())
	if r == nil {
		out := &pb.StepReply{BootId: s.boot}
		msg := fmt.Sprintf("session %q is not open here (serve restarted or the session ended): register again", q.GetSession())
		if why := s.endedWhy(q.GetSession()); why != "" {
			msg = fmt.Sprintf("session %q ended: %s; register again", q.GetSession(), why)
		}
		out.Errors = append(out.Errors, &pb.ItemError{Item: "session", Code: pb.ErrorCode_ERROR_CODE_UNKNOWN, Message: msg})
		s.metrics.unknownSession.Add(1)
		return out, nil
	}
	defer trace.StartRegion(ctx, "serve.rpc.step").End()
	out, err := s.call(ctx, r, call{kind: callStep, step: q})
	if err != nil {
		return nil, err
	}
	return out.step, nil
}

// Health reports the boot id and readiness.
func (s *Server) Health(ctx context.Context, _ *pb.HealthRequest) (*pb.HealthReply, error) {
	s.mu.RLock()
	ready := s.ready
	s.mu.RUnlock()
	out := &pb.HealthReply{BootId: s.boot, Ready: ready, Sessions: uint32(s.sessionCount()), Ranks: uint32(len(s.ranks)), Version: s.cfg.Version}
	if len(s.ranks) > 0 {
		g := s.ranks[0].st.Config.Payload
		out.PageTokens = uint32(g.PageTokens)
		for _, k := range g.Kinds {
			out.Kinds = append(out.Kinds, &pb.PayloadKind{Name: k.Name, PageBytes: uint64(k.PageBytes)})
		}
	}
	return out, nil
}

// Close ends a session.
func (s *Server) Close(ctx context.Context, q *pb.CloseRequest) (*pb.CloseReply, error) {
	r := s.rankOf(q.GetSession())
	if r == nil {
		if why := s.endedWhy(q.GetSession()); why != "" {
			return nil, status.Errorf(codes.NotFound, "session %q is not open here: it ended: %s", q.GetSession(), why)
		}
		return nil, status.Errorf(codes.NotFound, "session %q is not open here", q.GetSession())
	}
	out, err := s.call(ctx, r, call{kind: callClose, close: q})
	if err != nil {
		return nil, err
	}
	if out.err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "%v", out.err)
	}
	return &pb.CloseReply{}, nil
}

// Ping does nothing.
func (s *Server) Ping(context.Context, *pb.PingRequest) (*pb.PingReply, error) {
	return &pb.PingReply{}, nil
}

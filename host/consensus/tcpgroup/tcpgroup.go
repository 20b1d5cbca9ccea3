// Package tcpgroup is the rank group between processes: gRPC over TCP,
// rank 0 as the hub. Every rank sends its contribution for a tick to the
// hub in one unary call; the hub gathers the group's, reduces them once
// and answers every call with the same frontier bytes. With 8 ranks that
// is 7 round trips in parallel per tick, which loopback and a rack switch
// carry in well under a millisecond; a tree or ring would only pay off at
// far larger groups.
//
// Exchanges are ordered by tick: the hub holds one open tick at a time and
// refuses a contribution for a tick it already closed (a replay) or for
// another tick than the open one. Each exchange has a deadline counted
// from the first contribution of its tick: a rank that does not answer in
// time stops the group with an error naming it and the tick, on every
// rank (health goes not-ready), rather than hang or let ranks apply
// different frontiers. A peer of another group or stack, or bytes that do
// not decode, are refused with an error naming the peer and the tick, and
// do not disturb the group.
package tcpgroup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/internal/ratelog"
)

const (
	serviceName = "kvtier.consensus.v1.Group"
	methodName  = "/" + serviceName + "/Exchange"
)

// windowSize is the fixed HTTP/2 flow-control window: 16 of the largest
// messages in flight.
const windowSize = 1 << 26

// ErrClosed marks an exchange on a closed member.
var ErrClosed = errors.New("group member closed")

// Options configure one rank's member.
type Options struct {
	// Group and Stack identify the group and the tier stack; a peer with
	// other values is refused.
	Group, Stack uint64
	// Rank and Size place this member in the group; rank 0 is the hub.
	Rank, Size int
	// HubAddr is the hub's address, dialled by ranks other than 0.
	HubAddr string
	// Listener is where the hub serves (rank 0 only).
	Listener net.Listener
	// Timeout is the deadline of one exchange; default 5s.
	Timeout time.Duration
	// Logger receives refusals (rate-limited); default slog.Default().
	Logger *slog.Logger
}

// Validate checks the options.
func (o Options) Validate() error {
	switch {
	case o.Size < 1 || o.Size > consensus.MaxGroupSize:
		return fmt.Errorf("tcpgroup: group size %d, want 1..%d", o.Size, consensus.MaxGroupSize)
	case o.Rank < 0 || o.Rank >= o.Size:
		return fmt.Errorf("tcpgroup: rank %d outside a group of %d", o.Rank, o.Size)
	case o.Timeout < 0:
		return fmt.Errorf("tcpgroup: timeout %v is negative", o.Timeout)
	case o.Rank == 0 && o.Listener == nil:
		return errors.New("tcpgroup: rank 0 is the hub and needs a listener")
	case o.Rank != 0 && o.HubAddr == "":
		return fmt.Errorf("tcpgroup: rank %d needs the hub's address", o.Rank)
	}
	return nil
}

// Member is one rank's handle; it implements consensus.Group.
type Member struct {
	opts  Options
	env   consensus.Envelope
	exp   consensus.Expect
	guard consensus.TickGuard
	hub   *hub             // rank 0
	srv   *grpc.Server     // rank 0
	conn  *grpc.ClientConn // other ranks
	call  []grpc.CallOption

	// The stream to the hub (other ranks), opened by the first exchange
	// and kept: one HTTP/2 stream for the life of the group, so a tick
	// costs two messages and no stream set-up.
	stream       grpc.ClientStream
	streamCancel context.CancelCauseFunc

	mu      sync.Mutex
	stopped error
	buf     []byte
}

var _ consensus.Group = (*Member)(nil)

// New opens rank's member: the hub starts serving on opts.Listener, other
// ranks prepare a connection to opts.HubAddr (dialled lazily).
func New(opts Options) (*Member, error) {
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	m := &Member{
		opts: opts,
		env:  consensus.Envelope{Group: opts.Group, Stack: opts.Stack, Rank: opts.Rank, Size: opts.Size},
		exp:  consensus.Expect{Group: opts.Group, Stack: opts.Stack, Size: opts.Size, Peer: "rank 0 (hub)"},
	}
	maxLen := consensus.MaxEncodedLen + 1024
	if opts.Rank == 0 {
		m.hub = newHub(opts)
		// NB: a fixed window turns off gRPC's bandwidth-delay pings, which
		// otherwise ride on the small messages of every tick.
		m.srv = grpc.NewServer(grpc.ForceServerCodecV2(rawCodec{}), grpc.MaxRecvMsgSize(maxLen), grpc.MaxSendMsgSize(maxLen),
			grpc.InitialWindowSize(windowSize), grpc.InitialConnWindowSize(windowSize))
		m.srv.RegisterService(&serviceDesc, m.hub)
		go func() { _ = m.srv.Serve(opts.Listener) }()
		return m, nil
	}
	conn, err := grpc.NewClient(opts.HubAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(windowSize), grpc.WithInitialConnWindowSize(windowSize))
	if err != nil {
		return nil, fmt.Errorf("tcpgroup: rank %d: hub %s: %w", opts.Rank, opts.HubAddr, err)
	}
	m.conn = conn
	m.call = []grpc.CallOption{grpc.ForceCodecV2(rawCodec{}), grpc.MaxCallRecvMsgSize(maxLen), grpc.MaxCallSendMsgSize(maxLen), grpc.WaitForReady(true)}
	return m, nil
}

// Rank implements consensus.Group.
func (m *Member) Rank() int { return m.opts.Rank }

// Size implements consensus.Group.
func (m *Member) Size() int { return m.opts.Size }

// Err returns the error that stopped the group as this rank saw it, or nil
// while it is healthy (for /readyz).
func (m *Member) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stopped
}

// Close stops serving (the hub) or closes the connection; an exchange in
// progress fails.
func (m *Member) Close() error {
	m.setStopped(fmt.Errorf("tcpgroup: rank %d: %w", m.opts.Rank, ErrClosed))
	if m.hub != nil {
		m.hub.stop(fmt.Errorf("tcpgroup: hub: %w", ErrClosed))
		m.srv.Stop()
		return nil
	}
	m.mu.Lock()
	if m.streamCancel != nil {
		m.streamCancel(ErrClosed)
	}
	m.mu.Unlock()
	return m.conn.Close()
}

func (m *Member) setStopped(err error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped == nil {
		m.stopped = err
	}
	return err
}

// Exchange implements consensus.Group.
func (m *Member) Exchange(ctx context.Context, tick uint64, c consensus.Contribution) (consensus.Frontier, error) {
	m.mu.Lock()
	if m.stopped != nil {
		err := m.stopped
		m.mu.Unlock()
		return consensus.Frontier{}, consensus.Stopped(m.opts.Rank, tick, err)
	}
	if err := m.guard.Next(m.opts.Rank, tick, c); err != nil {
		m.stopped = err
		m.mu.Unlock()
		return consensus.Frontier{}, err
	}
	m.mu.Unlock()
	if m.hub != nil {
		rd, err := m.hub.submit(m.opts.Rank, tick, c.Clone(), consensus.RankName(0))
		if err != nil {
			return consensus.Frontier{}, m.setStopped(err)
		}
		select {
		case <-rd.done:
		case <-ctx.Done():
			return consensus.Frontier{}, m.setStopped(fmt.Errorf("tcpgroup: rank 0 at tick %d: %w", tick, ctx.Err()))
		}
		if rd.err != nil {
			return consensus.Frontier{}, m.setStopped(rd.err)
		}
		return rd.f.Clone(), nil
	}
	return m.exchangeRemote(ctx, tick, c)
}

var errExchangeDeadline = errors.New("exchange deadline")

func (m *Member) exchangeRemote(ctx context.Context, tick uint64, c consensus.Contribution) (consensus.Frontier, error) {
	var err error
	m.buf, err = consensus.AppendContribution(m.buf[:0], m.env, c)
	if err != nil {
		return consensus.Frontier{}, m.setStopped(err)
	}
	// NB: the hub's own deadline fires first and names the rank that is
	// missing; ours is a backstop for a hub that is gone (or never came
	// up: the stream waits for the connection, so the backstop is armed
	// before it opens). Either ends the stream, which is right: a rank
	// that missed a frontier is stopped.
	backstop := m.opts.Timeout + m.opts.Timeout/2 + 50*time.Millisecond
	if m.stream == nil {
		sctx, cancel := context.WithCancelCause(context.Background())
		m.mu.Lock()
		m.streamCancel = cancel
		m.mu.Unlock()
		timer := time.AfterFunc(backstop, func() { cancel(errExchangeDeadline) })
		stopWatch := context.AfterFunc(ctx, func() { cancel(ctx.Err()) })
		st, err := m.conn.NewStream(sctx, &serviceDesc.Streams[0], methodName, m.call...)
		timer.Stop()
		stopWatch()
		if err != nil {
			cancel(err)
			return consensus.Frontier{}, m.setStopped(fromStatus(m.opts.Rank, tick, err, ctx, sctx))
		}
		m.mu.Lock()
		m.stream = st
		m.mu.Unlock()
	}
	timer := time.AfterFunc(backstop, func() { m.streamCancel(errExchangeDeadline) })
	defer timer.Stop()
	stopWatch := context.AfterFunc(ctx, func() { m.streamCancel(ctx.Err()) })
	defer stopWatch()
	var resp []byte
	err = m.stream.SendMsg(&m.buf)
	if err == nil {
		err = m.stream.RecvMsg(&resp)
	}
	if err != nil {
		if err == io.EOF {
			// The send side learns of a failed stream by io.EOF; the
			// status comes from RecvMsg.
			err = m.stream.RecvMsg(&resp)
		}
		return consensus.Frontier{}, m.setStopped(fromStatus(m.opts.Rank, tick, err, ctx, m.stream.Context()))
	}
	_, f, err := consensus.DecodeFrontier(resp, m.exp)
	if err != nil {
		return consensus.Frontier{}, m.setStopped(err)
	}
	if err := consensus.CheckFrontier(m.opts.Rank, c, f); err != nil {
		return consensus.Frontier{}, m.setStopped(err)
	}
	return f, nil
}

// Status codes carry the sentinel across the wire.
var codeOf = []struct {
	err  error
	code codes.Code
}{
	{consensus.ErrTimeout, codes.Unavailable},
	{consensus.ErrStopped, codes.Aborted},
	{consensus.ErrForeign, codes.PermissionDenied},
	{consensus.ErrTick, codes.OutOfRange},
	{consensus.ErrMalformed, codes.InvalidArgument},
	{consensus.ErrShape, codes.FailedPrecondition},
	{consensus.ErrDigestMismatch, codes.DataLoss},
	{ErrClosed, codes.Canceled},
}

// hubPrefix marks a status the hub wrote, as opposed to one gRPC made up
// for a broken connection (both can say Unavailable).
const hubPrefix = "kvtier hub: "

func toStatus(err error) error {
	for _, e := range codeOf {
		if errors.Is(err, e.err) {
			return status.Error(e.code, hubPrefix+err.Error())
		}
	}
	return status.Error(codes.Internal, hubPrefix+err.Error())
}

func fromStatus(rank int, tick uint64, err error, parent, stream context.Context) error {
	st, _ := status.FromError(err)
	if stream != nil && errors.Is(context.Cause(stream), errExchangeDeadline) {
		return &consensus.PeerError{Peer: "rank 0 (hub)", Tick: tick, TickKnown: true,
			Err: fmt.Errorf("tcpgroup: rank %d got no frontier: %w", rank, consensus.ErrTimeout)}
	}
	msg, fromHub := strings.CutPrefix(st.Message(), hubPrefix)
	if !fromHub {
		if parent.Err() != nil {
			return fmt.Errorf("tcpgroup: rank %d at tick %d: %w", rank, tick, parent.Err())
		}
		// The connection broke or never came up: the hub is gone.
		return &consensus.PeerError{Peer: "rank 0 (hub)", Tick: tick, TickKnown: true,
			Err: fmt.Errorf("tcpgroup: rank %d lost the hub (%s): %w", rank, st.Message(), consensus.ErrTimeout)}
	}
	for _, e := range codeOf {
		if st.Code() == e.code {
			// NB: the hub's message ends with the same sentinel's text;
			// say it once.
			msg = strings.TrimSuffix(msg, ": "+e.err.Error())
			return fmt.Errorf("tcpgroup: rank %d at tick %d: hub says: %s: %w", rank, tick, msg, e.err)
		}
	}
	return fmt.Errorf("tcpgroup: rank %d at tick %d: hub says: %s", rank, tick, msg)
}

type exchanger interface {
	serve(stream grpc.ServerStream) error
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: serviceName,
	HandlerType: (*exchanger)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Exchange",
		ServerStreams: true,
		ClientStreams: true,
		Handler:       func(srv any, stream grpc.ServerStream) error { return srv.(exchanger).serve(stream) },
	}},
}

// round is one tick at the hub.
type round struct {
	tick  uint64
	cs    []consensus.Contribution
	have  []bool
	n     int
	timer *time.Timer
	done  chan struct{}
	f     consensus.Frontier
	enc   []byte
	err   error
}

type hub struct {
	opts Options
	log  *ratelog.Log

	mu       sync.Mutex
	cur      *round
	lastDone uint64
	started  bool
	stopped  error
}

func newHub(opts Options) *hub {
	return &hub{opts: opts, log: ratelog.New(opts.Logger, 10*time.Second)}
}

// serve runs one peer's stream: a contribution in, the frontier out, tick
// after tick. The first contribution binds the stream to its rank.
func (h *hub) serve(stream grpc.ServerStream) error {
	ctx := stream.Context()
	addr := "unknown address"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	exp := consensus.Expect{Group: h.opts.Group, Stack: h.opts.Stack, Size: h.opts.Size, Peer: addr}
	bound := -1
	for {
		var req []byte
		if err := stream.RecvMsg(&req); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		env, c, err := consensus.DecodeContribution(req, exp)
		if err == nil && (env.Rank == 0 || (bound >= 0 && env.Rank != bound)) {
			err = &consensus.PeerError{Peer: fmt.Sprintf("rank %d (%s)", env.Rank, addr), Tick: c.Tick, TickKnown: true,
				Err: fmt.Errorf("a stream of rank %d claims rank %d (rank 0 is the hub): %w", bound, env.Rank, consensus.ErrForeign)}
		}
		if err != nil {
			h.log.Warn("refused: "+addr, "tcpgroup: contribution refused", "err", err)
			return toStatus(err)
		}
		bound = env.Rank
		rd, err := h.submit(env.Rank, c.Tick, c, fmt.Sprintf("rank %d (%s)", env.Rank, addr))
		if err != nil {
			return toStatus(err)
		}
		select {
		case <-rd.done:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
		if rd.err != nil {
			return toStatus(rd.err)
		}
		if err := stream.SendMsg(rd.enc); err != nil {
			return err
		}
	}
}

// submit adds rank's contribution to the open tick, or refuses it.
func (h *hub) submit(rank int, tick uint64, c consensus.Contribution, name string) (*round, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped != nil {
		return nil, consensus.Stopped(rank, tick, h.stopped)
	}
	if h.started && tick <= h.lastDone {
		err := &consensus.PeerError{Peer: name, Tick: tick, TickKnown: true, Err: fmt.Errorf("replayed tick: the group closed tick %d: %w", h.lastDone, consensus.ErrTick)}
		h.log.Warn("replay", "tcpgroup: contribution refused", "err", err)
		return nil, err
	}
	rd := h.cur
	if rd == nil {
		rd = &round{tick: tick, cs: make([]consensus.Contribution, h.opts.Size), have: make([]bool, h.opts.Size), done: make(chan struct{})}
		rd.timer = time.AfterFunc(h.opts.Timeout, func() { h.expire(rd) })
		h.cur = rd
	}
	if rd.tick != tick {
		// Ranks at different ticks: no frontier may come out of this.
		h.fail(rd, &consensus.PeerError{Peer: name, Tick: tick, TickKnown: true, Err: fmt.Errorf("arrived while the group is at tick %d: %w", rd.tick, consensus.ErrTick)})
		return nil, h.stopped
	}
	if rd.have[rank] {
		err := &consensus.PeerError{Peer: name, Tick: tick, TickKnown: true, Err: fmt.Errorf("a second contribution for the tick: %w", consensus.ErrTick)}
		h.log.Warn("duplicate", "tcpgroup: contribution refused", "err", err)
		return nil, err
	}
	rd.cs[rank], rd.have[rank] = c, true
	rd.n++
	if rd.n < h.opts.Size {
		return rd, nil
	}
	rd.timer.Stop()
	f, err := consensus.Reduce(tick, rd.cs)
	if err == nil {
		rd.enc, err = consensus.AppendFrontier(nil, consensus.Envelope{Group: h.opts.Group, Stack: h.opts.Stack, Size: h.opts.Size}, f)
	}
	if err != nil {
		h.fail(rd, err)
		return rd, nil
	}
	rd.f, rd.cs = f, nil
	h.lastDone, h.started, h.cur = tick, true, nil
	close(rd.done)
	return rd, nil
}

// fail stops the group with err and ends rd with it; h.mu is held.
func (h *hub) fail(rd *round, err error) {
	if h.stopped == nil {
		h.stopped = err
		h.opts.Logger.Error("tcpgroup: group stopped", "err", err)
	}
	if rd != nil && rd.err == nil && h.cur == rd {
		rd.timer.Stop()
		rd.err = err
		h.cur = nil
		close(rd.done)
	}
}

func (h *hub) stop(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fail(h.cur, err)
}

func (h *hub) expire(rd *round) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur != rd {
		return
	}
	var missing []int
	for r, ok := range rd.have {
		if !ok {
			missing = append(missing, r)
		}
	}
	h.fail(rd, fmt.Errorf("tcpgroup: %w", consensus.MissingError(rd.tick, missing, h.opts.Timeout.String())))
}

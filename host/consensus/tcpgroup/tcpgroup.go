// Package tcpgroup is the rank group between processes: framed messages
// over TCP, rank 0 as the hub. Every rank sends its contribution for a
// tick to the hub on one long-lived connection; the hub gathers the
// group's, reduces them once and answers every rank with the same
// frontier bytes. With 8 ranks that is 7 round trips in parallel per tick,
// which loopback and a rack switch carry in well under a millisecond; a
// tree or ring would only pay off at far larger groups.
//
// The wire is the consensus encoding in length-prefixed frames (frame.go),
// not gRPC: a tick is one small message each way, and gRPC's HTTP/2
// framing and its reader and writer goroutines cost a third of the
// exchange's latency against a hand-written all-gather of the same bytes
// (`kvtier bench group`: 0.66x with gRPC).
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
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/internal/ratelog"
)

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
	hub   *hub    // rank 0
	srv   *server // rank 0
	buf   []byte  // the encoded contribution
	rbuf  []byte  // the frame read
	wbuf  []byte  // the frame written
	quit  context.Context
	close context.CancelFunc

	mu      sync.Mutex
	stopped error
	// The connection to the hub (other ranks), dialled by the first
	// exchange and kept for the life of the group.
	conn net.Conn
	rd   *bufio.Reader
}

var _ consensus.Group = (*Member)(nil)

// New opens rank's member: the hub starts serving on opts.Listener, other
// ranks dial opts.HubAddr at their first exchange.
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
	m.quit, m.close = context.WithCancel(context.Background())
	if opts.Rank == 0 {
		m.hub = newHub(opts)
		m.srv = newServer(opts.Listener, m.hub)
		go m.srv.run()
	}
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
	m.close()
	if m.hub != nil {
		m.hub.stop(fmt.Errorf("tcpgroup: hub: %w", ErrClosed))
		m.srv.stop()
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.conn != nil {
		return m.conn.Close()
	}
	return nil
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

func (m *Member) exchangeRemote(ctx context.Context, tick uint64, c consensus.Contribution) (consensus.Frontier, error) {
	var err error
	m.buf, err = consensus.AppendContribution(m.buf[:0], m.env, c)
	if err != nil {
		return consensus.Frontier{}, m.setStopped(err)
	}
	// NB: the hub's own deadline fires first and names the rank that is
	// missing; ours is a backstop for a hub that is gone or never came up.
	// Either way the rank is stopped: it missed a frontier.
	deadline := time.Now().Add(m.opts.Timeout + m.opts.Timeout/2 + 50*time.Millisecond)
	conn, rd, err := m.dial(ctx, deadline)
	if err != nil {
		return consensus.Frontier{}, m.setStopped(m.remoteErr(ctx, tick, err))
	}
	_ = conn.SetDeadline(deadline)
	if ctx.Done() != nil {
		stopWatch := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
		defer stopWatch()
	}
	var typ byte
	var body []byte
	if err = writeFrame(conn, frameContribution, m.buf, &m.wbuf); err == nil {
		typ, body, m.rbuf, err = readFrame(rd, m.rbuf)
	}
	if err != nil {
		return consensus.Frontier{}, m.setStopped(m.remoteErr(ctx, tick, err))
	}
	switch typ {
	case frameFrontier:
	case frameError:
		return consensus.Frontier{}, m.setStopped(hubError(m.opts.Rank, tick, body))
	default:
		return consensus.Frontier{}, m.setStopped(&consensus.PeerError{Peer: "rank 0 (hub)", Tick: tick, TickKnown: true,
			Err: fmt.Errorf("tcpgroup: rank %d got a frame of type %d, want a frontier: %w", m.opts.Rank, typ, consensus.ErrMalformed)})
	}
	_, f, err := consensus.DecodeFrontier(body, m.exp)
	if err != nil {
		return consensus.Frontier{}, m.setStopped(err)
	}
	if err := consensus.CheckFrontier(m.opts.Rank, c, f); err != nil {
		return consensus.Frontier{}, m.setStopped(err)
	}
	return f, nil
}

// dial returns the connection to the hub, dialling it (again every 20 ms
// until deadline: the hub's process may start after this one) when there
// is none yet.
func (m *Member) dial(ctx context.Context, deadline time.Time) (net.Conn, *bufio.Reader, error) {
	m.mu.Lock()
	conn, rd := m.conn, m.rd
	m.mu.Unlock()
	if conn != nil {
		return conn, rd, nil
	}
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	stop := context.AfterFunc(m.quit, cancel)
	defer stop()
	var d net.Dialer
	for {
		c, err := d.DialContext(dctx, "tcp", m.opts.HubAddr)
		if err == nil {
			m.mu.Lock()
			defer m.mu.Unlock()
			if m.stopped != nil {
				c.Close()
				return nil, nil, m.stopped
			}
			m.conn, m.rd = c, bufio.NewReaderSize(c, 4096)
			return m.conn, m.rd, nil
		}
		select {
		case <-dctx.Done():
			if dctx.Err() == context.DeadlineExceeded {
				return nil, nil, fmt.Errorf("no hub at %s within the deadline (last try: %v): %w", m.opts.HubAddr, err, os.ErrDeadlineExceeded)
			}
			return nil, nil, fmt.Errorf("dial %s: %w", m.opts.HubAddr, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// remoteErr names what ended an exchange with the hub: the caller's
// context, the backstop deadline, a closed member or a lost connection.
func (m *Member) remoteErr(ctx context.Context, tick uint64, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("tcpgroup: rank %d at tick %d: %w", m.opts.Rank, tick, ctx.Err())
	case m.quit.Err() != nil:
		return fmt.Errorf("tcpgroup: rank %d at tick %d: %w", m.opts.Rank, tick, ErrClosed)
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded):
		return &consensus.PeerError{Peer: "rank 0 (hub)", Tick: tick, TickKnown: true,
			Err: fmt.Errorf("tcpgroup: rank %d got no frontier (%v): %w", m.opts.Rank, err, consensus.ErrTimeout)}
	}
	// The connection broke or never came up: the hub is gone.
	return &consensus.PeerError{Peer: "rank 0 (hub)", Tick: tick, TickKnown: true,
		Err: fmt.Errorf("tcpgroup: rank %d lost the hub (%v): %w", m.opts.Rank, err, consensus.ErrTimeout)}
}

// Error codes carry the sentinel across the wire (frameError's first
// byte); 0 is an error without one.
var codeOf = []error{
	1: consensus.ErrTimeout,
	2: consensus.ErrStopped,
	3: consensus.ErrForeign,
	4: consensus.ErrTick,
	5: consensus.ErrMalformed,
	6: consensus.ErrShape,
	7: consensus.ErrDigestMismatch,
	8: ErrClosed,
}

// errorBody encodes err for a frameError.
func errorBody(err error) []byte {
	code := byte(0)
	for i, e := range codeOf {
		if e != nil && errors.Is(err, e) {
			code = byte(i)
			break
		}
	}
	msg := err.Error()
	if len(msg) > maxErrorMessage {
		msg = msg[:maxErrorMessage]
	}
	return append([]byte{code}, msg...)
}

// hubError decodes a frameError the hub sent.
func hubError(rank int, tick uint64, body []byte) error {
	if len(body) == 0 {
		return fmt.Errorf("tcpgroup: rank %d at tick %d: hub sent an empty error: %w", rank, tick, consensus.ErrMalformed)
	}
	msg := string(body[1:])
	if c := int(body[0]); c > 0 && c < len(codeOf) {
		e := codeOf[c]
		// NB: the hub's message ends with the same sentinel's text; say
		// it once.
		msg = strings.TrimSuffix(msg, ": "+e.Error())
		return fmt.Errorf("tcpgroup: rank %d at tick %d: hub says: %s: %w", rank, tick, msg, e)
	}
	return fmt.Errorf("tcpgroup: rank %d at tick %d: hub says: %s", rank, tick, msg)
}

// server accepts the ranks' connections at the hub and runs each.
type server struct {
	lis net.Listener
	hub *hub

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func newServer(lis net.Listener, h *hub) *server {
	return &server{lis: lis, hub: h, conns: map[net.Conn]struct{}{}}
}

func (s *server) run() {
	for {
		c, err := s.lis.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		go func() {
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			if err := s.hub.serve(c); err != nil {
				// The refusal goes to the peer, then the connection closes.
				_ = c.SetWriteDeadline(time.Now().Add(time.Second))
				_ = writeFrame(c, frameError, errorBody(err), nil)
			}
		}()
	}
}

func (s *server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	_ = s.lis.Close()
	for c := range s.conns {
		_ = c.Close()
	}
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

// serve runs one peer's connection: a contribution in, the frontier out,
// tick after tick. The first contribution binds the connection to its
// rank. It returns the refusal to send the peer, or nil when the peer
// left.
func (h *hub) serve(c net.Conn) error {
	addr := c.RemoteAddr().String()
	exp := consensus.Expect{Group: h.opts.Group, Stack: h.opts.Stack, Size: h.opts.Size, Peer: addr}
	rd := bufio.NewReaderSize(c, 4096)
	var (
		buf, wbuf []byte
		ct        consensus.Contribution // vectors reused frame after frame
		name      string                 // the bound rank's, formatted once
	)
	bound := -1
	for {
		typ, req, b, err := readFrame(rd, buf)
		buf = b
		if err != nil {
			if errors.Is(err, errFrame) {
				return fmt.Errorf("tcpgroup: peer %s: %w", addr, err)
			}
			return nil // gone (EOF, reset, closed)
		}
		if typ != frameContribution {
			return fmt.Errorf("tcpgroup: peer %s sent a frame of type %d, want a contribution: %w", addr, typ, consensus.ErrMalformed)
		}
		// NB: ct's vectors are free again here: the round that held them
		// reduced them before it closed done, which this loop waited for.
		var env consensus.Envelope
		env, ct, err = consensus.DecodeContributionInto(req, exp, ct)
		if err == nil && (env.Rank == 0 || (bound >= 0 && env.Rank != bound)) {
			err = &consensus.PeerError{Peer: fmt.Sprintf("rank %d (%s)", env.Rank, addr), Tick: ct.Tick, TickKnown: true,
				Err: fmt.Errorf("a connection of rank %d claims rank %d (rank 0 is the hub): %w", bound, env.Rank, consensus.ErrForeign)}
		}
		if err != nil {
			h.log.Warn("refused: "+addr, "tcpgroup: contribution refused", "err", err)
			return err
		}
		if bound < 0 {
			name = fmt.Sprintf("rank %d (%s)", env.Rank, addr)
		}
		bound = env.Rank
		round, err := h.submit(env.Rank, ct.Tick, ct, name)
		if err != nil {
			return err
		}
		<-round.done
		if round.err != nil {
			return round.err
		}
		if err := writeFrame(c, frameFrontier, round.enc, &wbuf); err != nil {
			return nil
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

package serve

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/host"
	"github.com/kvtier/kvtier/host/assemble"
	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/host/consensus/enginegroup"
	"github.com/kvtier/kvtier/host/consensus/inproc"
	"github.com/kvtier/kvtier/host/consensus/tcpgroup"
	"github.com/kvtier/kvtier/host/control"
)

// epoch is one life of the ranks' Machines: a new one starts when an
// engine's session ends (the engine's L1 went with it) or the group
// stopped, with new Machines over the same tiers and, with more than one
// rank, a new in-process group. Its context ends when a later epoch
// starts, releasing a rank still waiting in the old group's exchange.
type epoch struct {
	n       uint64
	members []consensus.Group // nil: one rank, in process
	// engine holds the same members when the engine is the transport.
	engine []*enginegroup.Member
	// close releases what the epoch's members hold (GroupTCP: the hub's
	// listener, the connection to it), or is nil.
	close func() error
	// why the epoch started (nil: the first); a rank that catches up
	// with it ends its session saying so.
	why    error
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// sessionEnded is why a later epoch started: a rank's session ended. A
// rank still waiting in the old epoch's exchange gets it (the cause of
// its exchange's end) instead of a bare context cancellation.
type sessionEnded struct {
	rank int
	why  string
}

func (e *sessionEnded) Error() string {
	return fmt.Sprintf("rank %d's session ended (%s)", e.rank, e.why)
}

// errServeStopped ends the last epoch when serve stops.
var errServeStopped = errors.New("serve stopped")

// newEpoch returns epoch n for the server's ranks.
func (s *Server) newEpoch(n uint64) (*epoch, error) {
	e := &epoch{n: n}
	e.ctx, e.cancel = context.WithCancelCause(context.Background())
	if s.cfg.Group == GroupEngine {
		// NB: the epoch is in the group id, so a frontier the engine
		// reduced in an earlier epoch is refused as foreign.
		h := fnv.New64a()
		_, _ = io.WriteString(h, s.boot)
		group := h.Sum64() ^ n
		_, _ = io.WriteString(h, s.cfg.DataDir)
		for r := range s.cfg.Ranks {
			m, err := enginegroup.New(r, s.cfg.Ranks, group, h.Sum64())
			if err != nil {
				e.cancel(err)
				return nil, fmt.Errorf("rank group: %w", err)
			}
			e.engine = append(e.engine, m)
			e.members = append(e.members, m)
		}
		return e, nil
	}
	if s.cfg.Group == GroupTCP {
		if n > 1 {
			e.cancel(errTCPRestart)
			return nil, errTCPRestart
		}
		m, err := s.tcpMember()
		if err != nil {
			e.cancel(err)
			return nil, fmt.Errorf("rank group: %w", err)
		}
		e.members, e.close = []consensus.Group{m}, m.Close
		return e, nil
	}
	if s.cfg.Ranks > 1 && !s.oneMachine() {
		ms, err := inproc.New(s.cfg.Ranks, inproc.Options{Timeout: s.cfg.GroupTimeout})
		if err != nil {
			e.cancel(err)
			return nil, fmt.Errorf("rank group: %w", err)
		}
		for _, m := range ms {
			e.members = append(e.members, m)
		}
	}
	return e, nil
}

// advance starts epoch from+1 unless a later one already started, and
// returns the current epoch. The old epoch's context ends with cause, so
// a rank waiting in its exchange learns why.
func (s *Server) advance(from uint64, cause error) *epoch {
	s.emu.Lock()
	defer s.emu.Unlock()
	if s.epoch.n > from {
		return s.epoch
	}
	e, err := s.newEpoch(from + 1)
	if err != nil {
		// inproc.New fails only for a size it refused at Open.
		s.log.Error("kvtier serve: new epoch", "err", err)
		return s.epoch
	}
	e.why = cause
	s.epoch.cancel(cause)
	s.epoch = e
	return e
}

// current returns the current epoch.
func (s *Server) current() *epoch {
	s.emu.Lock()
	defer s.emu.Unlock()
	return s.epoch
}

// broadcast moves every rank but from to epoch e (each in its goroutine),
// so their sessions end now, not at their next call. A rank catches up
// with the current epoch before any call anyway (rank.catchUp): the
// broadcast is not what keeps the group consistent.
func (s *Server) broadcast(e *epoch, from int) {
	if len(s.ranks) < 2 {
		return
	}
	s.mu.RLock()
	ctx := s.live
	s.mu.RUnlock()
	if ctx == nil {
		return
	}
	for _, r := range s.ranks {
		if r.idx == from {
			continue
		}
		go func() {
			_, _ = s.call(ctx, r, call{kind: callEpoch, epoch: e})
		}()
	}
}

// epochGroup is a group member whose exchanges end with its epoch.
type epochGroup struct {
	g   host.Group
	ctx context.Context
}

func (g epochGroup) Exchange(ctx context.Context, tick uint64, c control.Contribution) (control.Frontier, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(g.ctx, func() { cancel(context.Cause(g.ctx)) })
	defer stop()
	return g.g.Exchange(ctx, tick, c)
}

// timedGroup measures the group exchange and counts the digests it
// offers (digestEvery: the group compares digests on ticks that are its
// multiples; 0: a rank of one, which compares none) and the exchanges
// that failed on differing digests.
type timedGroup struct {
	g           host.Group
	m           *metrics
	rank        int
	st          *rankStats
	digestEvery uint64
	waiting     *atomic.Int32 // counts the exchanges in progress
}

func (t timedGroup) Exchange(ctx context.Context, tick uint64, c control.Contribution) (control.Frontier, error) {
	t.waiting.Add(1)
	defer t.waiting.Add(-1)
	if t.digestEvery > 0 && tick%t.digestEvery == 0 {
		t.st.digests.Add(1)
	}
	t0 := time.Now()
	f, err := t.g.Exchange(ctx, tick, c)
	t.m.observeExchange(t.rank, time.Since(t0))
	if errors.Is(err, consensus.ErrDigestMismatch) {
		t.st.mismatches.Add(1)
	}
	return f, err
}

// errTCPRestart ends Serve when the TCP group would need a new epoch.
var errTCPRestart = errors.New("the tcp rank group does not restart inside a process: restart every rank's serve")

// checkTCPGroup validates and completes the GroupTCP fields of cfg. A
// process hosts Ranks ranks (one node: GroupRank is its first, a multiple
// of Ranks) with one Machine, and the group over TCP has a member per
// process: GroupSize/Ranks of them.
func checkTCPGroup(cfg *Config) error {
	cfg.Ranks = max(cfg.Ranks, 1)
	switch {
	case cfg.Ranks > 1 && cfg.MachinePerRank:
		return fmt.Errorf("serve: group tcp: a Machine a rank (--machine-per-rank) needs one rank per process (ranks %d)", cfg.Ranks)
	case cfg.GroupSize < 1 || cfg.GroupSize > consensus.MaxGroupSize:
		return fmt.Errorf("serve: group tcp: group size %d, want 1..%d", cfg.GroupSize, consensus.MaxGroupSize)
	case cfg.GroupRank < 0 || cfg.GroupRank >= cfg.GroupSize:
		return fmt.Errorf("serve: group tcp: rank %d outside a group of %d", cfg.GroupRank, cfg.GroupSize)
	case cfg.GroupSize%cfg.Ranks != 0:
		return fmt.Errorf("serve: group tcp: group size %d is not a multiple of the %d ranks a process hosts", cfg.GroupSize, cfg.Ranks)
	case cfg.GroupRank%cfg.Ranks != 0:
		return fmt.Errorf("serve: group tcp: rank %d: a process of %d ranks hosts ranks from a multiple of %d (its first rank)", cfg.GroupRank, cfg.Ranks, cfg.Ranks)
	case cfg.GroupHub == "":
		return fmt.Errorf("serve: group tcp: no hub address (rank 0 listens there, the others dial it)")
	}
	if !cfg.AllowRemote {
		if err := checkLoopback(cfg.GroupHub); err != nil {
			return fmt.Errorf("group hub: %w", err)
		}
	}
	if cfg.GroupName == "" {
		cfg.GroupName = "kvtier"
	}
	return nil
}

// world is the size of the ranks' group; groupRank the group rank of the
// i-th rank this process hosts.
func (s *Server) world() int {
	if s.cfg.Group == GroupTCP {
		return s.cfg.GroupSize
	}
	return s.cfg.Ranks
}

// lanes is the number of owner lanes: the group's size with OwnerLanes,
// else 1 (every rank moves every page).
func (s *Server) lanes() int {
	if s.cfg.OwnerLanes {
		return s.world()
	}
	return 1
}

func (s *Server) groupRank(i int) int {
	if s.cfg.Group == GroupTCP {
		return s.cfg.GroupRank + i
	}
	return i
}

// tcpMember opens this process's member of the TCP group: rank 0 listens
// at the hub address. The group id is the group's name; the stack id a
// digest of the name and the page geometry, so peers configured with
// another geometry are refused.
func (s *Server) tcpMember() (*tcpgroup.Member, error) {
	h := fnv.New64a()
	_, _ = io.WriteString(h, "kvtier.group.v1\x00"+s.cfg.GroupName)
	group := h.Sum64()
	st, _, err := assemble.Load([]byte(expand(s.text, s.cfg, s.cfg.GroupRank, s.cfg.GroupSize)), s.name)
	if err != nil {
		return nil, err
	}
	_, _ = fmt.Fprintf(h, "\x00%d", st.Payload.PageTokens)
	for _, k := range st.Payload.Kinds {
		_, _ = fmt.Fprintf(h, "\x00%s=%d", k.Name, k.PageBytes)
	}
	// NB: a member per process (node): its index is its first rank over
	// the ranks each process hosts.
	opts := tcpgroup.Options{Group: group, Stack: h.Sum64(), Rank: s.cfg.GroupRank / s.cfg.Ranks, Size: s.cfg.GroupSize / s.cfg.Ranks,
		HubAddr: s.cfg.GroupHub, Timeout: s.cfg.GroupTimeout, Logger: s.log}
	if opts.Rank == 0 {
		lis, err := net.Listen("tcp", s.cfg.GroupHub)
		if err != nil {
			return nil, fmt.Errorf("hub listen %s: %w", s.cfg.GroupHub, err)
		}
		opts.Listener = lis
	}
	m, err := tcpgroup.New(opts)
	if err != nil && opts.Listener != nil {
		_ = opts.Listener.Close()
	}
	return m, err
}

package serve

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kvtier/kvtier/host"
	"github.com/kvtier/kvtier/host/assemble"
	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/host/stack"
)

func expand(text string, cfg Config, rank, ranks int) string {
	return Expand(text, cfg.DataDir, rank, ranks)
}

// Expand replaces serve's placeholders in a stack config's text as serve
// does for rank of ranks with the data dir dataDir (an absolute path, as
// serve makes its --data-dir): {{DIR}} by dataDir, {{RANK}} by rank,
// {{RANKS}} by ranks, {{DIRHASH}} by a short digest of dataDir.
func Expand(text, dataDir string, rank, ranks int) string {
	sum := sha256.Sum256([]byte(dataDir))
	return strings.NewReplacer("{{DIR}}", dataDir, "{{RANK}}", strconv.Itoa(rank), "{{RANKS}}", strconv.Itoa(ranks), "{{DIRHASH}}", hex.EncodeToString(sum[:4])).Replace(text)
}

// openRank opens one rank's stack and builds its Machine and Node.
func (s *Server) openRank(ctx context.Context, i int) (_ *rank, err error) {
	name := s.name
	st, regs, err := assemble.Load([]byte(expand(s.text, s.cfg, s.groupRank(i), s.world())), name)
	if err != nil {
		return nil, err
	}
	if st.Ranks.WorldSize > 1 && st.Ranks.WorldSize != s.world() {
		return nil, fmt.Errorf("%s: ranks.world_size is %d but serve's group has %d ranks", name, st.Ranks.WorldSize, s.world())
	}
	dir := filepath.Join(s.cfg.DataDir, fmt.Sprintf("rank%d", s.groupRank(i)))
	for _, d := range []string{dir, filepath.Join(dir, "index"), filepath.Join(dir, "shm"), filepath.Join(dir, "l3")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	log := s.log.With("rank", i)
	// The tiers name their own rank in a stack of more than one rank
	// (a shared stack: ranks.rank is {{RANK}}); a private stack (a world
	// of one) gets serve's rank from its logger. Either way no line
	// carries the key twice.
	stackLog := log
	if st.Ranks.WorldSize > 1 {
		stackLog = s.log
	}
	stk, err := stack.Open(ctx, st, regs, stack.Options{Logger: stackLog, StackID: s.stackID(i), Shared: s.shared, ColdStart: s.cfg.ColdStart, IndexDir: filepath.Join(dir, "index")})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = stk.Close()
		}
	}()
	var closeHook func() error
	if s.cfg.Stores != nil {
		if closeHook, err = s.cfg.Stores(ctx, i, stk); err != nil {
			return nil, fmt.Errorf("stores hook: %w", err)
		}
		defer func() {
			if err != nil && closeHook != nil {
				_ = closeHook()
			}
		}()
	}
	if !host.RunsPlans(stk) {
		what := "none"
		if stk.Pool != nil {
			what = stk.PoolName + " (" + stk.Pool.Geometry().Device + ")"
		}
		return nil, fmt.Errorf("%s: serve needs the pool tier `use: engine` (the engine's L1, whose copies the engine runs from serve's plans); the stack has %s", name, what)
	}
	base := control.DefaultOptions()
	base.SpillQueueCap, base.SpillInflight = 1024, 64
	// NB: one tick a step, so ReloadTTL is in engine steps: 256 steps
	// give the L3 2.5 s at 10 ms a step, 25 ms at 0.1 ms (64 made
	// back-to-back steps on a loaded machine miss what L3 held).
	base.ReloadMaxInflight, base.ReloadTTL = 16, 256
	base.DigestEvery = 64
	base.Logger = log
	lanes, lane := s.lanes(), 0
	if lanes > 1 {
		lane = s.groupRank(i)
	}
	mo, err := assemble.MachineOptions(stk, base, "", "serve")
	if err != nil {
		return nil, err
	}
	r := &rank{idx: i, srv: s, st: stk, log: log, calls: make(chan call), closeHook: closeHook,
		byID: map[control.ReqID]*request{}, mo: mo,
		nodeOpts: host.Options{Logger: log, SettleTimeout: s.cfg.DrainTimeout, Lanes: lanes, Rank: lane}}
	if s.oneMachine() {
		// The node's one Machine is built over every rank's stack once
		// they are all open (Open).
		return r, nil
	}
	if r.node, err = s.build(r, s.epoch); err != nil {
		return nil, err
	}
	r.epoch = s.epoch
	return r, nil
}

// build makes a rank's Machine and Node for epoch e: a group of one
// (host.Solo) for a single rank, else the epoch's in-process group
// through host.ConsensusGroup (digests compared every DigestEvery ticks).
func (s *Server) build(r *rank, e *epoch) (*host.Node, error) {
	node, _, err := assemble.Node(r.st, r.mo, r.nodeOpts, func(m *control.Machine) host.Group {
		var g host.Group = host.Solo{}
		if e.members != nil {
			g = epochGroup{g: host.ConsensusGroup{G: e.members[r.idx], M: m, DigestEvery: r.mo.DigestEvery}, ctx: e.ctx}
		}
		tg := timedGroup{g: g, m: s.metrics, rank: r.idx, st: &r.stats, waiting: &r.exchanging}
		if e.members != nil {
			tg.digestEvery = uint64(r.mo.DigestEvery)
		}
		return tg
	})
	return node, err
}

// sharedIf returns a set of shared indexes when the ranks write disjoint
// pages (owner lanes): then ranks whose configs name one index share it.
// Without lanes every rank would write every page's entry, so a second
// open of one index stays refused.
func sharedIf(ownerLanes bool) *stack.Shared {
	if ownerLanes {
		return stack.NewShared()
	}
	return nil
}

// stackID names the stack of the i-th rank this process hosts in the
// tiers' files: one per rank, except with owner lanes, where the ranks are
// one group that may share a slab (a joining rank finds rank 0's by the
// stack id) and an index (every file still names its rank).
func (s *Server) stackID(i int) string {
	if s.cfg.OwnerLanes {
		return "serve"
	}
	return fmt.Sprintf("serve-r%d", s.groupRank(i))
}

// Package serve is `kvtier serve`: it hosts the Nodes of the ranks its
// stack config names (one control Machine each, over one opened stack
// each), and serves the engine API kvtier.engine.v1 (api/enginev1) to the
// engine ranks over a unix socket and, when asked, loopback TCP. One
// goroutine per rank owns its Node; gRPC handlers hand it calls. See
// docs/engine-api.md for the call sequence and docs/serve.md for running
// it.
//
// The engine's L1 is the engine's memory: the rank's Pool v1 is an engine
// pool that turns the Machine's L1<->L2 copies into copy plans in the
// Step reply, and the engine's reports into the pool's acks.
package serve

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/host"
	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/host/consensus/enginegroup"
	"github.com/kvtier/kvtier/host/consensus/inproc"
	"github.com/kvtier/kvtier/host/consensus/tcpgroup"
	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/host/pagestore"
	"github.com/kvtier/kvtier/host/stack"
	"github.com/kvtier/kvtier/internal/nsdigest"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l1cuda"
)

//go:embed default.yaml
var defaultYAML string

// DefaultYAML returns the embedded default stack config (with its
// {{DIR}}, {{RANK}}, {{RANKS}} and {{DIRHASH}} placeholders).
func DefaultYAML() string { return defaultYAML }

//go:embed shared.yaml
var sharedYAML string

// SharedYAML returns the embedded stack of serve --owner-lanes without
// --config: the node's ranks share one slab and one index.
func SharedYAML() string { return sharedYAML }

// Config configures a Server.
type Config struct {
	// YAML is the stack config text (empty: the embedded default). Its
	// placeholders are replaced: {{DIR}} by DataDir, {{RANK}} by the rank,
	// {{RANKS}} by Ranks, {{DIRHASH}} by a short digest of DataDir. A
	// config for more than one rank must use {{RANK}} in its paths.
	YAML string
	// ConfigName names YAML in errors (a file path).
	ConfigName string
	// DataDir holds every rank's files; required.
	DataDir string
	// Ranks is the number of ranks to host (0: the config's
	// ranks.world_size; the embedded default: 1).
	Ranks int
	// Socket is the unix socket path (mode 0600); required.
	Socket string
	// Listen, when set, also serves on this TCP address, which must be
	// loopback unless AllowRemote.
	Listen      string
	AllowRemote bool
	// Metrics, when set, serves /metrics, /healthz and /readyz on this
	// loopback address.
	Metrics string
	// ColdStart is what the stores do with a previous run's data
	// (default load: a restart finds its L3 pages again).
	ColdStart tiers.ColdStart
	// SessionTTL expires a session silent this long (default 30 s).
	SessionTTL time.Duration
	// MaxItemsPerStep and MaxPagesPerRequest bound one Step (defaults
	// 65536 and 1<<20 / page... see defaults).
	MaxItemsPerStep    int
	MaxPagesPerRequest int
	// MaxMessageBytes bounds one gRPC message serve receives (default
	// DefaultMaxMessageBytes); a larger Step is refused with
	// ResourceExhausted before it is decoded, and serve goes on. It must
	// carry at least one lookup and one store of MaxPagesPerRequest
	// pages (their hashes).
	MaxMessageBytes int
	// PlanTimeout fails a copy plan the engine has not reported this long
	// after the reply that carried it (default 30 s, as SessionTTL: an
	// engine that steps but never reports a plan holds its L1 pages no
	// longer than a silent one holds its session). The Machine rolls the
	// plan back and the next Step reply names it (item "plan:N",
	// UNAVAILABLE).
	PlanTimeout time.Duration
	// DrainTimeout bounds the graceful stop (default 10 s).
	DrainTimeout time.Duration
	// GroupTimeout bounds one exchange of the ranks' group (more than one
	// rank): a rank whose engine does not step within it stops the group,
	// every session ends and a new epoch starts (default 30 s).
	GroupTimeout time.Duration
	// Group is how the ranks agree on each tick: GroupInproc (default:
	// serve exchanges between the ranks it hosts) or GroupEngine (the
	// engine all-reduces the contributions its ranks' steps return and
	// sends the frontier in their next steps, as SGLang all-reduces its
	// counters; a rank waits between steps, bounded by SessionTTL).
	Group string
	// GroupRank, GroupSize, GroupHub and GroupName configure GroupTCP:
	// this process hosts rank GroupRank of GroupSize ranks, one serve
	// process per rank, exchanging over TCP (host/consensus/tcpgroup)
	// through the hub at GroupHub (rank 0 listens there, the others dial
	// it; loopback unless AllowRemote). GroupName names the group (a peer
	// of another name is refused; default "kvtier").
	//
	// The TCP group does not restart inside the process: a session's end
	// or a stopped group (a peer that died or timed out, a digest
	// mismatch) ends Serve with an error that says why, and the operator's
	// supervisor restarts every rank's serve, which find their L3 pages
	// again (cold start load). The ranks' Machines must start over
	// together, and a restart of all of them is the one way that needs no
	// agreement on epochs between processes.
	GroupRank, GroupSize int
	GroupHub, GroupName  string
	// OwnerLanes makes the ranks a context-parallel group with owner
	// lanes: page i of a key belongs to rank i mod the group's size, and
	// each rank copies, spills, reloads and deletes only its own pages
	// (host.Options.Lanes). Register says so (owner_lanes), and the
	// engine's ranks compute and keep only their own pages. With it the
	// ranks of a node can share one slab and one index: every page is
	// written by one rank.
	OwnerLanes bool
	// Version is reported by Health.
	Version string
	// Logger receives serve's and the tiers' lines (nil: discarded).
	Logger *slog.Logger
	// Stores, for fault injection in tests only, runs after a rank's
	// stack opened and may replace its stores (a store over errorfs);
	// the returned function closes what it opened, before the stack.
	Stores func(ctx context.Context, rank int, s *stack.Stack) (func() error, error)
	// Doors lists the doors served on the socket: DoorEngine
	// (kvtier.engine.v1, over the ranks' stacks) and DoorStore
	// (kvtier.store.v1, over its own stack); nil: the engine door only
	// (`kvtier serve --doors` defaults to both). With only the store
	// door, serve hosts no engine ranks (an SGLang-only node).
	Doors []string
	// StoreYAML is the store door's stack config (empty: the embedded
	// store.yaml); StoreConfigName names it in errors. {{DIR}} is
	// replaced by DataDir, {{DIRHASH}} by its digest.
	StoreYAML, StoreConfigName string
	// StoreLimits bound the store door's calls (zero fields: defaults).
	StoreLimits pagestore.Limits
	// StoreSkipVerify turns off the CRC check of slab hits at BatchGet.
	StoreSkipVerify bool
	// StoreStores, for fault injection in tests only, may replace the
	// store door's stores after its stack opened; the returned function
	// closes what it opened, before the stack.
	StoreStores func(ctx context.Context, s *stack.Stack) (func() error, error)
	// Record, when set, writes rank 0's lookups to this file as a
	// Mooncake-format JSONL trace (hash ids remapped to small integers
	// per file, never the page hashes), off the step's path; the file
	// rotates past RecordMaxBytes (DefaultRecordMaxBytes) to Record.1,
	// .2, ..., keeping the newest RecordKeep (DefaultRecordKeep).
	Record         string
	RecordMaxBytes int64
	RecordKeep     int
	// Shadow names policies to run as shadows beside the live one
	// (docs/policies.md, "A/B on live traffic"); it replaces the stack's
	// policy.shadow list. Empty: the stack's list, if any.
	Shadow []string
}

// DefaultMaxMessageBytes is the default of Config.MaxMessageBytes: 64
// MiB, 32 times what the largest request's hashes take (MaxPagesPerRequest
// 65536 pages x 32 bytes = 2 MiB), so a step of 32 such lookups, or some
// 2000 lookups of 1024 pages (a 512k-token prompt at 512 tokens a page),
// still fits, while serve holds at most a few times 64 MiB for one
// message (gRPC's buffer and the decoded request) instead of 256 MiB.
const DefaultMaxMessageBytes = 64 << 20

// Group transports of Config.Group.
const (
	GroupInproc = "inproc"
	GroupEngine = "engine"
	GroupTCP    = "tcp"
)

// Server is a running kvtier serve.
type Server struct {
	cfg Config
	// rec records rank 0's lookups (Config.Record), or is nil.
	rec *recorder
	// shadow replays rank 0's lookups under shadow policies
	// (Config.Shadow, policy.shadow), or is nil.
	shadow *shadows
	// text is the stack config every rank expands ({{RANK}}, {{DIR}}):
	// cfg.YAML or the embedded default; name names it in errors.
	text, name string
	boot       string
	ranks      []*rank
	// shared holds the indexes the ranks of this process share (owner
	// lanes only: ranks that write disjoint pages; nil otherwise).
	shared  *stack.Shared
	log     *slog.Logger
	metrics *metrics
	// store is the page-store door, or nil when it is off.
	store *storeDoor

	emu   sync.Mutex // guards epoch
	epoch *epoch

	mu       sync.RWMutex
	sessions map[string]*rank
	conns    map[string]uint64 // session -> the connection it registered on
	// ended: why recently ended sessions ended (at most maxEnded, oldest
	// forgotten first, in endedOrder).
	ended      map[string]string
	endedOrder []string
	live       context.Context // while serving: the ranks' context

	ready     bool
	listening chan struct{} // closed once the socket accepts connections
	// fatal receives the error that ends Serve from inside (GroupTCP: the
	// group stopped or a session ended).
	fatal chan error
	pb.UnimplementedEngineServer
}

// Open opens every rank's stack and builds its Node. Serve starts serving.
func Open(ctx context.Context, cfg Config) (_ *Server, err error) {
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("serve: no data dir")
	}
	if cfg.Socket == "" {
		return nil, fmt.Errorf("serve: no socket path")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ColdStart == "" {
		cfg.ColdStart = tiers.ColdStartLoad
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 30 * time.Second
	}
	if cfg.MaxItemsPerStep <= 0 {
		cfg.MaxItemsPerStep = 65536
	}
	if cfg.MaxPagesPerRequest <= 0 {
		cfg.MaxPagesPerRequest = 1 << 16
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	// One lookup and one store of the largest request, with room for
	// the rest of the message.
	if need := 2*cfg.MaxPagesPerRequest*pagehash.Size + 64<<10; cfg.MaxMessageBytes < need {
		return nil, fmt.Errorf("serve: max message bytes %d cannot carry a lookup and a store of %d pages (the most a request may have): want at least %d", cfg.MaxMessageBytes, cfg.MaxPagesPerRequest, need)
	}
	if cfg.PlanTimeout <= 0 {
		cfg.PlanTimeout = 30 * time.Second
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	if cfg.GroupTimeout <= 0 {
		cfg.GroupTimeout = 30 * time.Second
	}
	for _, d := range cfg.Doors {
		if d != DoorEngine && d != DoorStore {
			return nil, fmt.Errorf("serve: door %q: want %q or %q", d, DoorEngine, DoorStore)
		}
	}
	switch cfg.Group {
	case "":
		cfg.Group = GroupInproc
	case GroupInproc, GroupEngine:
	case GroupTCP:
		if err := checkTCPGroup(&cfg); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("serve: group transport %q: want %q, %q or %q", cfg.Group, GroupInproc, GroupEngine, GroupTCP)
	}
	if cfg.Listen != "" && !cfg.AllowRemote {
		if err := checkLoopback(cfg.Listen); err != nil {
			return nil, err
		}
	}
	if cfg.Metrics != "" {
		if err := checkLoopback(cfg.Metrics); err != nil {
			return nil, fmt.Errorf("serve: metrics: %w", err)
		}
	}
	abs, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("serve: data dir: %w", err)
	}
	cfg.DataDir = abs
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("serve: data dir: %w", err)
	}
	text, name := cfg.YAML, cfg.ConfigName
	if text == "" {
		text, name = defaultYAML, "embedded default stack"
		if cfg.OwnerLanes {
			// The ranks write disjoint pages: they share one slab and
			// one index.
			text, name = sharedYAML, "embedded shared stack"
		}
		if cfg.Ranks <= 0 {
			cfg.Ranks = 1
		}
	}
	if name == "" {
		name = "serve config"
	}
	if cfg.Ranks <= 0 {
		// Read the world size from the config itself (rank 0's view).
		// NB: not with GroupTCP, which set Ranks to 1 (one rank per
		// process).
		st, _, err := loadStack(expand(text, cfg, 0, 1), name)
		if err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
		cfg.Ranks = max(1, st.Ranks.WorldSize)
	}
	s := &Server{cfg: cfg, text: text, name: name, boot: newBootID(), shared: sharedIf(cfg.OwnerLanes), log: cfg.Logger, sessions: map[string]*rank{}, conns: map[string]uint64{}, listening: make(chan struct{}),
		fatal: make(chan error, 1)}
	if s.world() > 1 && !strings.Contains(text, "{{RANK}}") {
		return nil, fmt.Errorf("serve: %s: %d ranks share one config, so its paths must contain {{RANK}} (each rank needs its own slab, L3 and index)", name, s.world())
	}
	s.metrics = newMetrics(s)
	if s.epoch, err = s.newEpoch(1); err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	defer func() {
		if err != nil {
			for _, r := range s.ranks {
				if r.closeHook != nil {
					_ = r.closeHook()
				}
				_ = r.st.Close()
			}
		}
	}()
	for i := range cfg.Ranks {
		if !s.door(DoorEngine) {
			break
		}
		r, err := s.openRank(ctx, i)
		if err != nil {
			return nil, fmt.Errorf("serve: rank %d: %w", i, err)
		}
		s.ranks = append(s.ranks, r)
	}
	if s.door(DoorStore) {
		if err := s.openStoreDoor(ctx); err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
	}
	if cfg.Record != "" && len(s.ranks) > 0 {
		if s.rec, err = openRecorder(cfg.Record, cfg.RecordMaxBytes, cfg.RecordKeep, s.log); err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
	}
	if len(s.ranks) > 0 {
		if err := s.openShadows(); err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
	}
	return s, nil
}

// openShadows starts the shadow policies of Config.Shadow, else of rank
// 0's policy.shadow, at rank 0's tier capacities; none named, none run.
func (s *Server) openShadows() error {
	r := s.ranks[0]
	names := s.cfg.Shadow
	if len(names) == 0 {
		names = r.st.Config.Policy.Shadow
	}
	if len(names) == 0 {
		return nil
	}
	reg, err := builtin.Policies()
	if err != nil {
		return err
	}
	if err := config.CheckShadow(names, reg); err != nil {
		return fmt.Errorf("--shadow: %w", err)
	}
	var ts []shadowTier
	if r.pool != nil && r.mo.L1Pages > 0 {
		ts = append(ts, shadowTier{name: "l1", pages: r.mo.L1Pages})
	}
	if len(r.mo.L2.Kinds) > 0 {
		ts = append(ts, shadowTier{name: "l2", pages: r.mo.L2.Kinds[0].Pages()})
	}
	for _, t := range r.st.Stores {
		if c, pb := t.Store.Stats().CapacityBytes, r.st.Config.Payload.Kinds[0].PageBytes; c > 0 && pb > 0 {
			ts = append(ts, shadowTier{name: t.Name, pages: c / pb})
		}
	}
	sh, err := openShadows(r.st.Config.Policy.Evictor, names, ts, int64(r.st.Config.Payload.PageTokens), s.log)
	if err != nil {
		return err
	}
	if err := s.metrics.reg.Register(shadowCollector{sh}); err != nil {
		sh.Close()
		return fmt.Errorf("shadow metrics: %w", err)
	}
	s.shadow = sh
	s.log.Info("kvtier serve: shadow policies on", "live", sh.policies[0], "shadows", sh.policies[1:], "tiers", ts)
	return nil
}

func newBootID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return strconv.FormatInt(time.Now().Unix(), 36) + "-" + hex.EncodeToString(b[:])
}

func checkLoopback(addr string) error {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("serve: address %q: %w", addr, err)
	}
	if h == "localhost" {
		return nil
	}
	ip := net.ParseIP(h)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("serve: address %q is not loopback; serving beyond this host needs the explicit opt-in (--allow-remote)", addr)
	}
	return nil
}

func expand(text string, cfg Config, rank, ranks int) string {
	sum := sha256.Sum256([]byte(cfg.DataDir))
	return strings.NewReplacer("{{DIR}}", cfg.DataDir, "{{RANK}}", strconv.Itoa(rank), "{{RANKS}}", strconv.Itoa(ranks), "{{DIRHASH}}", hex.EncodeToString(sum[:4])).Replace(text)
}

func loadStack(text, name string) (*config.Stack, stack.Registries, error) {
	tr, err := builtin.Tiers()
	if err != nil {
		return nil, stack.Registries{}, err
	}
	ix, err := builtin.Indexes()
	if err != nil {
		return nil, stack.Registries{}, err
	}
	pr, err := builtin.Policies()
	if err != nil {
		return nil, stack.Registries{}, err
	}
	st, err := config.Load([]byte(text), name, config.Modules{Tiers: tr, Indexes: ix, Policies: pr})
	if err != nil {
		return nil, stack.Registries{}, err
	}
	return st, stack.Registries{Tiers: tr, Indexes: ix}, nil
}

// openRank opens one rank's stack and builds its Machine and Node.
func (s *Server) openRank(ctx context.Context, i int) (_ *rank, err error) {
	name := s.name
	st, regs, err := loadStack(expand(s.text, s.cfg, s.groupRank(i), s.world()), name)
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
	pool, ok := stk.Pool.(*l1cuda.EnginePool)
	if !ok {
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
	mo, err := host.MachineOptions(stk, base, "")
	if err != nil {
		return nil, err
	}
	if mo.NewEvictor, err = evictor(st); err != nil {
		return nil, err
	}
	r := &rank{idx: i, srv: s, st: stk, pool: pool, log: log, calls: make(chan call), closeHook: closeHook,
		byID: map[control.ReqID]*request{}, mo: mo,
		nodeOpts: host.Options{Logger: log, SettleTimeout: s.cfg.DrainTimeout, Lanes: lanes, Rank: lane}}
	if r.m, r.node, err = s.build(r, s.epoch); err != nil {
		return nil, err
	}
	r.epoch = s.epoch
	return r, nil
}

// build makes a rank's Machine and Node for epoch e: a group of one
// (host.Solo) for a single rank, else the epoch's in-process group
// through host.ConsensusGroup (digests compared every DigestEvery ticks).
func (s *Server) build(r *rank, e *epoch) (*control.Machine, *host.Node, error) {
	m, err := control.New(r.mo)
	if err != nil {
		return nil, nil, err
	}
	var g host.Group = host.Solo{}
	if e.members != nil {
		g = epochGroup{g: host.ConsensusGroup{G: e.members[r.idx], M: m, DigestEvery: r.mo.DigestEvery}, ctx: e.ctx}
	}
	o := r.nodeOpts
	tg := timedGroup{g: g, m: s.metrics, rank: r.idx, st: &r.stats, waiting: &r.exchanging}
	if e.members != nil {
		tg.digestEvery = uint64(r.mo.DigestEvery)
	}
	o.Group = tg
	node, err := host.New(r.st, m, o)
	if err != nil {
		return nil, nil, err
	}
	return m, node, nil
}

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
	if s.cfg.Ranks > 1 {
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

// evictor returns a builder of the stack's eviction policy.
func evictor(st *config.Stack) (func() (policy.Evictor, error), error) {
	reg, err := builtin.Policies()
	if err != nil {
		return nil, err
	}
	e, err := reg.Lookup(policy.EvictorV1, st.Policy.Evictor)
	if err != nil {
		return nil, fmt.Errorf("policy %q: %w", st.Policy.Evictor, err)
	}
	build := func() (policy.Evictor, error) { return e.Factory(policy.Options{Params: st.Policy.Params}) }
	if _, err := build(); err != nil {
		return nil, fmt.Errorf("policy %q (serve runs online policies only): %w", st.Policy.Evictor, err)
	}
	return build, nil
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

// Listening is closed once Serve's socket accepts connections.
func (s *Server) Listening() <-chan struct{} { return s.listening }

// BootID is the server's boot id.
func (s *Server) BootID() string { return s.boot }

// Ranks is the number of ranks served.
func (s *Server) Ranks() int { return len(s.ranks) }

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

// Serve listens and serves until ctx ends, then drains: it stops taking
// calls (in-flight ones finish, bounded by DrainTimeout), fails the plans
// engines still owe, waits for the stores' in-flight puts and closes every
// stack in order. It closes the Server.
func (s *Server) Serve(ctx context.Context) (err error) {
	lis, err := listenUnix(s.cfg.Socket)
	if err != nil {
		s.closeRanks(context.Background())
		return err
	}
	defer os.Remove(s.cfg.Socket)
	// NB: the socket file exists from bind(), before listen(): a client
	// that dials when the file appears can be refused. Listening says
	// when connections are accepted.
	close(s.listening)
	gs := grpc.NewServer(grpc.MaxRecvMsgSize(s.cfg.MaxMessageBytes), grpc.MaxSendMsgSize(256<<20), grpc.StatsHandler(&connTracker{s: s}))
	if s.door(DoorEngine) {
		pb.RegisterEngineServer(gs, s)
	}
	s.registerStore(gs)
	errc := make(chan error, 3)
	go func() { errc <- gs.Serve(lis) }()
	if s.cfg.Listen != "" {
		tl, err := net.Listen("tcp", s.cfg.Listen)
		if err != nil {
			gs.Stop()
			s.closeRanks(context.Background())
			return fmt.Errorf("serve: listen %s: %w", s.cfg.Listen, err)
		}
		go func() { errc <- gs.Serve(tl) }()
	}
	var hs *http.Server
	if s.cfg.Metrics != "" {
		ml, err := net.Listen("tcp", s.cfg.Metrics)
		if err != nil {
			gs.Stop()
			s.closeRanks(context.Background())
			return fmt.Errorf("serve: metrics listen %s: %w", s.cfg.Metrics, err)
		}
		hs = &http.Server{Handler: s.metrics.handler(), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := hs.Serve(ml); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("serve: metrics: %w", err)
			}
		}()
	}
	rctx, stopRanks := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	for _, r := range s.ranks {
		wg.Add(1)
		go func() { defer wg.Done(); r.loop(rctx) }()
	}
	s.mu.Lock()
	s.ready = true
	s.live = rctx
	s.mu.Unlock()
	s.log.Info("kvtier serve: serving", "socket", s.cfg.Socket, "tcp", s.cfg.Listen, "metrics", s.cfg.Metrics, "ranks", len(s.ranks), "boot_id", s.boot)
	select {
	case <-ctx.Done():
	case err = <-errc:
		s.log.Error("kvtier serve: listener failed", "err", err)
	case err = <-s.fatal:
		s.log.Error("kvtier serve: stopping", "err", err)
	}
	s.mu.Lock()
	s.ready = false
	s.live = nil
	s.mu.Unlock()
	s.log.Info("kvtier serve: draining")
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.cfg.DrainTimeout):
		s.log.Warn("kvtier serve: calls still running after the drain timeout; stopping them")
		gs.Stop()
	}
	stopRanks()
	wg.Wait()
	if hs != nil {
		_ = hs.Close()
	}
	dctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
	defer cancel()
	if cerr := s.closeRanks(dctx); cerr != nil && err == nil {
		err = cerr
	}
	s.log.Info("kvtier serve: stopped")
	return err
}

// closeRanks ends every session, settles in-flight store work and closes
// the stacks (each in its own order: pool, stores, indexes, slab).
func (s *Server) closeRanks(ctx context.Context) error {
	var errs []error
	s.emu.Lock()
	s.epoch.cancel(errServeStopped)
	if s.epoch.close != nil {
		if err := s.epoch.close(); err != nil {
			errs = append(errs, fmt.Errorf("rank group: close: %w", err))
		}
	}
	s.emu.Unlock()
	for _, r := range s.ranks {
		r.dropSession("serve stopped")
		if err := r.node.Settle(ctx); err != nil {
			errs = append(errs, fmt.Errorf("rank %d: settle: %w", r.idx, err))
		}
		if err := r.node.Close(); err != nil {
			errs = append(errs, fmt.Errorf("rank %d: %w", r.idx, err))
		}
		if r.closeHook != nil {
			if err := r.closeHook(); err != nil {
				errs = append(errs, fmt.Errorf("rank %d: stores hook: %w", r.idx, err))
			}
		}
		if err := r.st.Close(); err != nil {
			errs = append(errs, fmt.Errorf("rank %d: %w", r.idx, err))
		}
	}
	if err := s.closeStore(); err != nil {
		errs = append(errs, err)
	}
	if err := s.rec.Close(); err != nil {
		errs = append(errs, fmt.Errorf("serve: %w", err))
	}
	s.shadow.Close()
	return errors.Join(errs...)
}

// listenUnix listens on path with mode 0600. A socket file left by a dead
// serve is removed; one a live serve answers on is refused.
func listenUnix(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("serve: socket path %s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("serve: socket %s: another serve is listening there", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("serve: remove stale socket %s: %w", path, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("serve: socket dir: %w", err)
	}
	old := umask(0o177)
	l, err := net.Listen("unix", path)
	umask(old)
	if err != nil {
		return nil, fmt.Errorf("serve: listen %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("serve: chmod %s: %w", path, err)
	}
	return l, nil
}

// registerReply describes the rank's slab, kinds and limits.
func (s *Server) registerReply(r *rank, ses *session) *pb.RegisterReply {
	g := r.st.Slab.Geometry()
	sg := &pb.SlabGeometry{PageSize: uint64(g.PageSize), Backing: g.Backing}
	for _, f := range g.Slabs {
		sg.Files = append(sg.Files, &pb.SlabFile{Id: uint32(f.ID), Path: f.Path, Size: uint64(f.Size)})
	}
	out := &pb.RegisterReply{Session: ses.id, BootId: s.boot, ProtocolVersion: 1, Slab: sg,
		Limits: &pb.Limits{L1Pages: uint32(r.pool.Geometry().Pages), MaxPagesPerRequest: uint32(s.cfg.MaxPagesPerRequest),
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

// errTCPRestart ends Serve when the TCP group would need a new epoch.
var errTCPRestart = errors.New("the tcp rank group does not restart inside a process: restart every rank's serve")

// checkTCPGroup validates and completes the GroupTCP fields of cfg.
func checkTCPGroup(cfg *Config) error {
	switch {
	case cfg.Ranks > 1:
		return fmt.Errorf("serve: group tcp: one rank per process (ranks %d)", cfg.Ranks)
	case cfg.GroupSize < 1 || cfg.GroupSize > consensus.MaxGroupSize:
		return fmt.Errorf("serve: group tcp: group size %d, want 1..%d", cfg.GroupSize, consensus.MaxGroupSize)
	case cfg.GroupRank < 0 || cfg.GroupRank >= cfg.GroupSize:
		return fmt.Errorf("serve: group tcp: rank %d outside a group of %d", cfg.GroupRank, cfg.GroupSize)
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
	cfg.Ranks = 1
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
	st, _, err := loadStack(expand(s.text, s.cfg, s.cfg.GroupRank, s.cfg.GroupSize), s.name)
	if err != nil {
		return nil, err
	}
	_, _ = fmt.Fprintf(h, "\x00%d", st.Payload.PageTokens)
	for _, k := range st.Payload.Kinds {
		_, _ = fmt.Fprintf(h, "\x00%s=%d", k.Name, k.PageBytes)
	}
	opts := tcpgroup.Options{Group: group, Stack: h.Sum64(), Rank: s.cfg.GroupRank, Size: s.cfg.GroupSize,
		HubAddr: s.cfg.GroupHub, Timeout: s.cfg.GroupTimeout, Logger: s.log}
	if s.cfg.GroupRank == 0 {
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

// stop ends Serve with err (the first one wins).
func (s *Server) stop(err error) {
	select {
	case s.fatal <- err:
	default:
	}
}

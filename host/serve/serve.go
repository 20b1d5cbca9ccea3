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
	"cmp"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/host/assemble"
	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/host/pagestore"
	"github.com/kvtier/kvtier/host/stack"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
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
	// YAML is the stack config text (empty with no ConfigName: the
	// embedded default; empty with one, a file with nothing in it, is
	// refused as `kvtier config validate` refuses it). Its
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
	// MaxItemsPerStep bounds the items of one Step: its completions,
	// lookups, stores, finished, aborted and upcoming keys together
	// (default 65536). MaxPagesPerRequest bounds the pages of one
	// request's key, a lookup's, a store's or an upcoming one's (default
	// 65536).
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
	// MachinePerRank runs a control Machine on each rank the process
	// hosts, exchanging through the in-process group, instead of one
	// Machine for all of them (the default; nodemachine.go). For
	// comparisons (kvtier bench serve --cpu-sessions).
	MachinePerRank bool
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
	// StoreYAML is the store door's stack config (empty with no
	// StoreConfigName: the embedded store.yaml; empty with one is refused
	// like YAML); StoreConfigName names it in errors. {{DIR}} is
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

	// nodeMu guards nm, the node's one Machine of the current epoch
	// (oneMachine; nodemachine.go), and every use of it.
	nodeMu sync.Mutex
	nm     *nodeMachine

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
	if n := len(cfg.Socket); n > maxSocketPath {
		// NB: checked before any tier opens; the kernel's own refusal
		// comes at bind, as "invalid argument".
		return nil, fmt.Errorf("serve: socket path %s: %d bytes, a unix socket's path holds at most %d: use a shorter --socket", cfg.Socket, n, maxSocketPath)
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
	if text == "" && name == "" {
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
	if strings.TrimSpace(text) == "" {
		// An empty file: the loader's own error, before any check of
		// what the config would have to contain.
		_, _, err := assemble.Load(nil, name)
		return nil, fmt.Errorf("serve: %w", cmp.Or(err, errors.New(name+": config is empty")))
	}
	if cfg.Ranks <= 0 {
		// Read the world size from the config itself (rank 0's view).
		// NB: not with GroupTCP, which set Ranks to at least 1 (the
		// ranks this process hosts, not the group's world size).
		st, _, err := assemble.Load([]byte(expand(text, cfg, 0, 1)), name)
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
	for i := range s.ranks {
		// Every rank's latency series exist from the start (empty), in
		// every group mode, so a dashboard's queries always find them.
		s.metrics.exchange.WithLabelValues(strconv.Itoa(i))
		s.metrics.barrier.WithLabelValues(strconv.Itoa(i))
	}
	if s.oneMachine() && len(s.ranks) > 0 {
		if s.nm, err = s.buildNode(s.epoch); err != nil {
			return nil, fmt.Errorf("serve: the node's machine: %w", err)
		}
		for i, r := range s.ranks {
			r.node, r.epoch = s.nm.view(i), s.epoch
		}
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
	if r.mo.L1Pages > 0 {
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

// Listening is closed once Serve's socket accepts connections.
func (s *Server) Listening() <-chan struct{} { return s.listening }

// BootID is the server's boot id.
func (s *Server) BootID() string { return s.boot }

// Ranks is the number of ranks served.
func (s *Server) Ranks() int { return len(s.ranks) }

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
	// NB: every session first, so that the plans every engine owed are
	// failed before any settle waits: with one Machine for the ranks a
	// settle waits for every rank's work.
	for _, r := range s.ranks {
		r.dropSession("serve stopped")
	}
	for _, r := range s.ranks {
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

// maxSocketPath is the longest unix socket path Linux binds: its
// sockaddr_un holds 108 bytes, the last a NUL.
const maxSocketPath = len(unix.RawSockaddrUnix{}.Path) - 1

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

// stop ends Serve with err (the first one wins).
func (s *Server) stop(err error) {
	select {
	case s.fatal <- err:
	default:
	}
}

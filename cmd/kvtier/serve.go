package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strings"
	"time"

	"github.com/kvtier/kvtier/host/pagestore"
	"github.com/kvtier/kvtier/host/serve"
	"github.com/kvtier/kvtier/internal/bgprio"
	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/tiers"
	"github.com/spf13/cobra"
)

// maxConfigBytes bounds a stack config file read by serve.
const maxConfigBytes = 1 << 20

// newServeCmd returns `kvtier serve`.
func newServeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve [flags]",
		Short: "serve the engine API: the ranks of a stack over a unix socket",
		Long: `Hosts the Nodes of the ranks a stack config names (one control Machine per
rank, each over its own slab, L3 and index) and serves the engine API
kvtier.engine.v1 on a unix socket (mode 0600) and, with --listen, on
loopback TCP. Without --config it runs the embedded default stack (a demo
geometry with small pages) with every file under --data-dir. SIGTERM or
SIGINT drains in-flight calls and closes the tiers in order; after a crash,
a restart with the same --data-dir finds the L3 pages again (cold start
load). With more than one rank the ranks agree on every tick: serve
exchanges their contributions itself (--group inproc), or the engine
all-reduces them over its own collective (--group engine: each StepReply
carries the rank's contribution, the next StepRequest the reduced
frontier), or one serve process per rank exchanges over TCP (--group tcp:
rank 0 listens at --group-hub, the others dial it; a stopped group or a
session's end ends the process, exit status 1 with the reason, and a
restart of every rank's serve finds the L3 pages again).
See docs/serve.md and docs/engine-api.md.`,
		Example: `  kvtier serve
  kvtier serve --config stack.yaml --socket /tmp/kvtier.sock --ranks 4 --metrics 127.0.0.1:9464
  kvtier serve --doors store --socket /tmp/kvtier.sock
  kvtier serve --shadow s3fifo,slru --metrics 127.0.0.1:9464`,
	}
	fs := cmd.Flags()
	cfgPath := fs.String("config", "", "stack config `file` ({{DIR}} = --data-dir, {{RANK}} = the rank; default: the embedded demo stack)")
	dataDir := fs.String("data-dir", "", "`dir` for every rank's slab, L3 and index (default: $XDG_STATE_HOME/kvtier or ~/.local/state/kvtier)")
	socket := fs.String("socket", "", "unix socket `path` (default: DIR/kvtier.sock)")
	listen := fs.String("listen", "", "also serve on this loopback TCP `addr`")
	allowRemote := fs.Bool("allow-remote", false, "allow --listen and --group-hub on a non-loopback address")
	metricsAddr := fs.String("metrics", "", "serve /metrics, /healthz, /readyz on this loopback `addr` (e.g. 127.0.0.1:9400)")
	ranks := fs.Int("ranks", 0, "number of ranks to host (0: the config's ranks.world_size; the embedded default: 1)")
	group := fs.String("group", serve.GroupInproc, "group transport of the ranks: inproc (serve exchanges), engine (the engine all-reduces) or tcp (one serve process per rank)")
	groupRank := fs.Int("group-rank", 0, "with --group tcp: the rank this process hosts (with --ranks N, its first, a multiple of N)")
	groupSize := fs.Int("group-size", 0, "with --group tcp: the number of ranks in the group (the processes times --ranks)")
	groupHub := fs.String("group-hub", "", "with --group tcp: the hub's `addr` (rank 0 listens, the others dial; loopback unless --allow-remote)")
	groupName := fs.String("group-name", "kvtier", "with --group tcp: the group's name (peers of another name are refused)")
	groupTimeout := fs.Duration("group-timeout", 30*time.Second, "a rank that does not step within this stops the group")
	machinePerRank := fs.Bool("machine-per-rank", false, "run a control Machine on each rank this serve hosts, exchanging between them in process, instead of one Machine for the node's ranks (for comparisons; docs/serve.md)")
	ownerLanes := fs.Bool("owner-lanes", false, "the ranks are a context-parallel group: page i of a key is rank i mod the group size's, and each rank moves only its own pages (lets a node's ranks share one slab and one index)")
	cold := fs.String("cold-start", "load", "what stores do with a previous run's data: load or clear")
	ttl := fs.Duration("session-ttl", 30*time.Second, "expire a session silent this long")
	planTimeout := fs.Duration("plan-timeout", 30*time.Second, "fail (and roll back) a copy plan the engine has not reported this long after the reply that carried it")
	maxMsg := fs.Int("max-message-bytes", serve.DefaultMaxMessageBytes, "largest gRPC message serve receives (a larger Step is refused with ResourceExhausted)")
	record := fs.String("record", "", "write rank 0's lookups to `file` as a Mooncake-format JSONL trace (hash ids remapped to small integers per file; replay it with kvtier replay FILE --sweep)")
	recordMax := fs.String("record-max-bytes", "256MiB", "rotate the recording past this `size` (FILE.1, FILE.2, ...)")
	recordKeep := fs.Int("record-keep", serve.DefaultRecordKeep, "recording files kept (the oldest beyond are removed)")
	shadow := fs.String("shadow", "", "comma-separated `policies` to run as shadows beside the live one: metadata-only replays of rank 0's lookups at the live tiers' capacities, exported as kvtier_shadow_hit_tokens_total{policy,tier} (compare with kvtier ab; replaces the stack's policy.shadow)")
	bgNice := fs.Bool("background-nice", true, "run the tiers' spill workers (copies, checksums, writes, fsyncs) on OS threads of nice 19, with GOMAXPROCS raised to twice its default when $GOMAXPROCS is unset, so an engine's steps run first on busy cores")
	traceFile := fs.String("trace", "", "write a Go execution trace of the whole run to `file` (go tool trace; for finding what a slow step waited for: docs/serve.md)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to `file` (go tool pprof; what a step's CPU goes to: docs/serve.md)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	doorsFlag := fs.String("doors", "", "the doors served on the socket, comma-separated: engine (kvtier.engine.v1), store (kvtier.store.v1, the page store of SGLang's HiCache backend); with store alone serve hosts no engine ranks (default: engine,store; with --group tcp: engine, as the node's one store door belongs to one process)")
	storeCfg := fs.String("store-config", "", "the store door's stack config `file` (a slab and stores, no pool; {{DIR}} = --data-dir; default: the embedded demo store stack under DIR/store)")
	storeVerify := fs.Bool("store-verify", true, "check each slab page's CRC32C at every store BatchGet (a page that fails is a miss, never wrong bytes)")
	storeLease := fs.Duration("store-lease", 30*time.Second, "a store get's pins and a set's reservations end this long after the call if not released or committed")
	storeTTL := fs.Duration("store-session-ttl", 10*time.Minute, "close a store session without a call for this long (a dropped connection ends its sessions at once)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		stdout := cmd.OutOrStdout()
		stderr := cmd.ErrOrStderr()
		if fs.NArg() > 0 {
			return fmt.Errorf("serve: unexpected arguments %q: %w", fs.Args(), errUsage)
		}
		if *ranks < 0 || *ranks > 64 {
			return fmt.Errorf("serve: --ranks %d: want 0..64: %w", *ranks, errUsage)
		}
		switch *group {
		case serve.GroupInproc, serve.GroupEngine:
			if *groupHub != "" || *groupSize != 0 || *groupRank != 0 {
				return fmt.Errorf("serve: --group-rank, --group-size and --group-hub go with --group tcp: %w", errUsage)
			}
		case serve.GroupTCP:
			if *groupSize < 1 || *groupRank < 0 || *groupRank >= *groupSize || *groupHub == "" {
				return fmt.Errorf("serve: --group tcp needs --group-size N, --group-rank in 0..N-1 and --group-hub ADDR: %w", errUsage)
			}
		default:
			return fmt.Errorf("serve: --group %q: want %s, %s or %s: %w", *group, serve.GroupInproc, serve.GroupEngine, serve.GroupTCP, errUsage)
		}
		if *groupTimeout < 100*time.Millisecond || *groupTimeout > time.Hour {
			return fmt.Errorf("serve: --group-timeout %s: want 100ms..1h: %w", *groupTimeout, errUsage)
		}
		if *ttl < time.Second || *ttl > 24*time.Hour {
			return fmt.Errorf("serve: --session-ttl %s: want 1s..24h: %w", *ttl, errUsage)
		}
		if *doorsFlag == "" {
			*doorsFlag = "engine,store"
			if *group == serve.GroupTCP {
				*doorsFlag = "engine"
			}
		}
		doors, err := serve.ParseDoors(*doorsFlag)
		if err != nil {
			return fmt.Errorf("serve: --doors: %w: %w", err, errUsage)
		}
		if *storeLease < 100*time.Millisecond || *storeLease > time.Hour {
			return fmt.Errorf("serve: --store-lease %s: want 100ms..1h: %w", *storeLease, errUsage)
		}
		if *storeTTL < time.Second || *storeTTL > 24*time.Hour {
			return fmt.Errorf("serve: --store-session-ttl %s: want 1s..24h: %w", *storeTTL, errUsage)
		}
		if *planTimeout < 100*time.Millisecond || *planTimeout > 24*time.Hour {
			return fmt.Errorf("serve: --plan-timeout %s: want 100ms..24h: %w", *planTimeout, errUsage)
		}
		if *maxMsg < 1<<20 || *maxMsg > 1<<30 {
			return fmt.Errorf("serve: --max-message-bytes %d: want 1048576..1073741824 (1 MiB..1 GiB): %w", *maxMsg, errUsage)
		}
		recMax, err := quantity.ParseSize(*recordMax)
		if err != nil || recMax < 1<<20 || recMax > 1<<40 {
			return fmt.Errorf("serve: --record-max-bytes %q: want a size in 1MiB..1TiB: %w", *recordMax, errUsage)
		}
		if *recordKeep < 1 || *recordKeep > 10000 {
			return fmt.Errorf("serve: --record-keep %d: want 1..10000: %w", *recordKeep, errUsage)
		}
		var level slog.Level
		if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
			return fmt.Errorf("serve: --log-level %q: %w", *logLevel, errUsage)
		}
		if *bgNice {
			enableBackgroundNice()
		}
		if *traceFile != "" {
			stop, err := startTrace(*traceFile)
			if err != nil {
				return fmt.Errorf("serve: --trace: %w", err)
			}
			defer stop()
		}
		if *cpuProfile != "" {
			stop, err := startCPUProfile(*cpuProfile)
			if err != nil {
				return fmt.Errorf("serve: --cpuprofile: %w", err)
			}
			defer stop()
		}
		cs := tiers.ColdStart(*cold)
		if cs != tiers.ColdStartLoad && cs != tiers.ColdStartClear {
			return fmt.Errorf("serve: --cold-start %q: want load or clear: %w", *cold, errUsage)
		}
		dir, err := serveDataDir(*dataDir)
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		sock := *socket
		if sock == "" {
			sock = serveSocketIn(dir)
		}
		var text string
		if *cfgPath != "" {
			b, err := readBounded(*cfgPath, maxConfigBytes)
			if err != nil {
				return fmt.Errorf("serve: %w", err)
			}
			text = string(b)
		}
		var storeText string
		if *storeCfg != "" {
			b, err := readBounded(*storeCfg, maxConfigBytes)
			if err != nil {
				return fmt.Errorf("serve: --store-config: %w", err)
			}
			storeText = string(b)
		}
		logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
		s, err := serve.Open(ctx, serve.Config{YAML: text, ConfigName: *cfgPath, DataDir: dir, Ranks: *ranks, Socket: sock,
			Listen: *listen, AllowRemote: *allowRemote, Metrics: *metricsAddr, ColdStart: cs, SessionTTL: *ttl, PlanTimeout: *planTimeout, MaxMessageBytes: *maxMsg, Group: *group,
			GroupRank: *groupRank, GroupSize: *groupSize, GroupHub: *groupHub, GroupName: *groupName, GroupTimeout: *groupTimeout, OwnerLanes: *ownerLanes, MachinePerRank: *machinePerRank,
			Version: version, Logger: logger, Doors: doors, StoreYAML: storeText, StoreConfigName: *storeCfg, StoreSkipVerify: !*storeVerify,
			StoreLimits: pagestore.Limits{Lease: *storeLease, SessionTTL: *storeTTL},
			Record:      *record, RecordMaxBytes: int64(recMax), RecordKeep: *recordKeep, Shadow: splitList(*shadow)})
		if err != nil {
			return err
		}
		if *group == serve.GroupTCP {
			fmt.Fprintf(stdout, "kvtier serve: rank %d of a tcp group of %d (hub %s), socket %s, data %s, boot_id %s\n", *groupRank, *groupSize, *groupHub, sock, dir, s.BootID())
		} else {
			fmt.Fprintf(stdout, "kvtier serve: %d rank(s), doors %s, socket %s, data %s, boot_id %s\n", s.Ranks(), strings.Join(doors, ","), sock, dir, s.BootID())
		}
		return s.Serve(ctx)
	}
	return cmd
}

// readBounded reads a file of at most limit bytes.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, nil
}

// defaultServeDataDir is serve's --data-dir default: $XDG_STATE_HOME/kvtier,
// or ~/.local/state/kvtier. kvtier doctor finds serve's socket by it.
func defaultServeDataDir() (string, error) {
	base := os.Getenv("XDG_STATE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("no --data-dir and no home directory: %w", err)
		}
		base = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(base, "kvtier"), nil
}

// serveDataDir is a --data-dir flag's value, or serve's default when it
// is empty.
func serveDataDir(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	return defaultServeDataDir()
}

// serveSocketIn is serve's --socket default under the data dir dir.
func serveSocketIn(dir string) string { return filepath.Join(dir, "kvtier.sock") }

// startTrace writes a Go execution trace to path until the returned
// function is called.
func startTrace(path string) (stop func(), err error) {
	return startRecording(path, trace.Start, trace.Stop)
}

// startCPUProfile writes a CPU profile to path until the returned function
// is called.
func startCPUProfile(path string) (stop func(), err error) {
	return startRecording(path, pprof.StartCPUProfile, pprof.StopCPUProfile)
}

// startRecording creates path, starts a recorder writing to it, and
// returns what stops the recorder and closes the file.
func startRecording(path string, start func(io.Writer) error, end func()) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := start(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return func() {
		end()
		if err := f.Close(); err != nil {
			slog.Warn("kvtier: recording not closed", "path", path, "err", err)
		}
	}, nil
}

// enableBackgroundNice puts the tiers' spill workers on low-priority
// threads (internal/bgprio) and, unless $GOMAXPROCS is set, raises
// GOMAXPROCS to twice Go's default (which follows the CPU affinity and
// the cgroup's quota): a lowered worker holds its P while it runs, and
// the step's goroutines need Ps of their own to run first.
func enableBackgroundNice() {
	bgprio.Enable()
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(2 * bgprio.CPUs())
	}
}

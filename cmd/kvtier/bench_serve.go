package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kvtier/kvtier/host/serve"
	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/kvtier/kvtier/loadgen"
	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/workload"
	"github.com/spf13/cobra"
)

// newBenchServeCmd returns `kvtier serve`.
func newBenchServeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve [flags]",
		Short: "an in-process serve's step latency against an empty Ping",
		Long: `Runs an in-process kvtier serve on the embedded demo
stack with one rank per session, driven by loadgen's sessions in lockstep,
each step holding up to per-step new requests (and the stores and finishes
of earlier ones); before every step each session times an empty Ping on
the same socket, the limit.`,
		Example: `  kvtier bench serve
  kvtier bench serve --json`,
	}
	fs := cmd.Flags()
	sessions := fs.Int("sessions", 8, "rank sessions (serve ranks)")
	perStep := fs.Int("per-step", 32, "new requests per step")
	requests := fs.Int("requests", 4000, "requests of the generated workload")
	dir := fs.String("dir", os.TempDir(), "`directory` for the ranks' L3 and indexes")
	l3 := fs.String("l3", "l3disk", "the ranks' L3: l3disk (the embedded demo stack), memstore (in RAM) or none")
	asJSON := fs.Bool("json", false, "print one JSON object per line")
	copies := fs.Bool("copies", true, "run the engine's copies in the bench process (false: report plans done without copying, the control plane alone)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run to `file`; with a serve subprocess (--process, --cpu-sessions, --shadow) each round's serve also writes its own to FILE.serve.N")
	ownerLanes := fs.Bool("owner-lanes", false, "serve's --owner-lanes: the sessions are a context-parallel group, each rank moving only its own pages (page i is rank i mod sessions's); default: every rank moves every page")
	bgNice := fs.Bool("background-nice", true, "serve's --background-nice: the tiers' spill workers on nice-19 threads (in process: GOMAXPROCS raised for the whole bench)")
	traceFile := fs.String("trace", "", "write a Go execution trace of the run to `file` (go tool trace; -pprof=sched shows what steps waited for); with --process each round's serve also writes its own to FILE.serve.N")
	pageBytes := fs.String("page-bytes", "", "page `size` per payload kind (e.g. 2816KiB, the seed's geometry); the stack is sized in pages: an L1 of 2x --max-pages, an L2 of 6x, an L3 of 16x per rank (empty: the embedded demo stack)")
	maxPages := fs.Int("max-pages", 64, "pages per request at most (longer prompts are cut)")
	shadow := fs.String("shadow", "", "comma-separated `policies`: alternate rounds of a serve subprocess with --shadow and without, and report serve's CPU per step of each and their ratio (default 3 rounds)")
	cpuSessions := fs.String("cpu-sessions", "", "comma-separated session `counts` (e.g. 1,8): run a serve subprocess with each, --rounds times in turn (default 3), and report serve's CPU per engine step of each and its ratio to the first's")
	process := fs.Bool("process", false, "run serve as its own process (as under a real engine), not in the bench process")
	rounds := fs.Int("rounds", 0, "alternate N rounds with the --l3 tier and N without L3, each a fresh serve, and report the step p99 of each and their ratio (0: one run)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		stdout := cmd.OutOrStdout()
		switch {
		case fs.NArg() > 0:
			return fmt.Errorf("bench serve: unexpected arguments %q: %w", fs.Args(), errUsage)
		case *sessions < 1 || *sessions > 64:
			return fmt.Errorf("bench serve: --sessions %d: want 1..64: %w", *sessions, errUsage)
		case *perStep < 1 || *perStep > 4096:
			return fmt.Errorf("bench serve: --per-step %d: want 1..4096: %w", *perStep, errUsage)
		case *requests < 1 || *requests > 1_000_000:
			return fmt.Errorf("bench serve: --requests %d: want 1..1000000: %w", *requests, errUsage)
		case *maxPages < 1 || *maxPages > 4096:
			return fmt.Errorf("bench serve: --max-pages %d: want 1..4096: %w", *maxPages, errUsage)
		case *rounds < 0 || *rounds > 100:
			return fmt.Errorf("bench serve: --rounds %d: want 0..100: %w", *rounds, errUsage)
		case *rounds > 0 && *l3 == "none" && *shadow == "" && *cpuSessions == "":
			return fmt.Errorf("bench serve: --rounds compares --l3 %s with no L3: name an L3 (l3disk or memstore): %w", *l3, errUsage)
		}
		var pb quantity.Size
		if *pageBytes != "" {
			var err error
			if pb, err = quantity.ParseSize(*pageBytes); err != nil {
				return fmt.Errorf("bench serve: --page-bytes: %w: %w", err, errUsage)
			}
			if pb < 4096 || pb > 64<<20 || pb%4096 != 0 {
				return fmt.Errorf("bench serve: --page-bytes %s: want a multiple of 4KiB in 4KiB..64MiB: %w", *pageBytes, errUsage)
			}
		}
		if need := saturatingMul(saturatingMul(int64(pb), int64(8**maxPages)), int64(*sessions)); pb > 0 && need > machineOf(ctx).MemAvailable {
			// Per session: an L1 of 2x --max-pages and an L2 of 6x, in RAM.
			return fmt.Errorf("bench serve: --page-bytes %s with --max-pages %d and --sessions %d needs %s of memory (L1 and L2 of %d pages a session), %s has %s: %w",
				*pageBytes, *maxPages, *sessions, quantity.Size(need), 8**maxPages, machineOf(ctx).MemSource, quantity.Size(machineOf(ctx).MemAvailable), errUsage)
		}
		o := serveRound{sessions: *sessions, perStep: *perStep, requests: *requests, dir: *dir, copies: *copies, pageBytes: int64(pb), maxPages: *maxPages, traceFile: *traceFile, cpuProfile: *cpuProfile, bgNice: *bgNice, ownerLanes: *ownerLanes}
		if *cpuProfile != "" {
			stop, err := startCPUProfile(*cpuProfile)
			if err != nil {
				return fmt.Errorf("bench serve: %w", err)
			}
			defer stop()
		}
		if *traceFile != "" {
			stop, err := startTrace(*traceFile)
			if err != nil {
				return fmt.Errorf("bench serve: --trace: %w", err)
			}
			defer stop()
		}
		if *cpuSessions != "" {
			counts, err := parseSessionCounts(splitList(*cpuSessions))
			if err != nil {
				return fmt.Errorf("bench serve: %w", err)
			}
			n := *rounds
			if n == 0 {
				n = 3
			}
			return benchServeSessions(ctx, o, *l3, counts, n, stdout, *asJSON)
		}
		if *shadow != "" {
			n := *rounds
			if n == 0 {
				n = 3
			}
			return benchServeShadow(ctx, o, *l3, splitList(*shadow), n, stdout, *asJSON)
		}
		o.process = *process
		if *rounds > 0 {
			return benchServeRounds(ctx, o, *l3, *rounds, stdout, *asJSON)
		}
		res, err := o.runOnce(ctx, *l3)
		if err != nil {
			return err
		}
		what := copiesRun
		if !*copies {
			what = copiesNotRun
		}
		note := fmt.Sprintf("L3 %s, %s; %s; %d sessions in lockstep (one serve rank each), %d new requests a step, %d requests, %d steps; payloads not generated (loadgen verifies them); ratio = ping/step; %s",
			*l3, what, o.geometry(), *sessions, *perStep, res.Requests, res.Steps, loadNote())
		lower := func(name string, v, limit float64, target float64) benchreport.Result {
			r := benchreport.Result{Bench: name, Value: v, Unit: "us", Limit: limit, LimitName: "empty gRPC call, same socket", Target: target, Note: note}
			if v > 0 {
				r.Ratio = limit / v
			}
			return r
		}
		copyTarget := 0.0
		if o.pageBytes > 0 {
			// Issue 27: at the seed's geometry (--page-bytes 2816KiB).
			copyTarget = 0.8
		}
		rows := []benchreport.Result{
			lower("serve/step_p50", res.StepUsP50, res.PingUsP50, 0),
			lower("serve/step_p99", res.StepUsP99, res.PingUsP99, 2000),
			{Bench: "serve/step_max", Value: res.StepUsMax, Unit: "us", Note: note},
			copyRow("serve/load_gbps", res.LoadGBps, "engine copies slab -> L1 (mapped shm or hugetlbfs), over the time spent copying", res, copyTarget),
			copyRow("serve/store_gbps", res.StoreGBps, "engine copies L1 -> slab with the pages' CRC-32C in the same pass, over the time spent copying", res, copyTarget),
			{Bench: "serve/copy_share", Value: res.CopyShare, Unit: "fraction", Note: fmt.Sprintf("the engine copies' share of the run's wall time; %d plan items copied as %d runs (contiguous items are one copy)", res.CopyItems, res.CopyRuns)},
			{Bench: "serve/hit_rate", Value: res.HitRate, Unit: "fraction", Note: "hit pages by serve's answers (bytes not generated here)"},
		}
		return benchreport.Write(stdout, rows, *asJSON)
	}
	return cmd
}

// copyRow is a copy row against the memcpy limit measured beside the
// copies (loadgen.Result.MemcpyGBps).
func copyRow(name string, v float64, what string, res loadgen.Result, target float64) benchreport.Result {
	r := benchreport.Result{Bench: name, Value: v, Unit: "GB/s", Target: target,
		Note: fmt.Sprintf("%s; the limit: plain copies of as many bytes in runs of the same lengths, each right after its plan, between scratch buffers (out of cache); memcpy after the run, best of 5, %.2f GB/s", what, res.MemcpyAfterGBps)}
	return r.WithLimit("memcpy beside the copies, same bytes", res.MemcpyGBps)
}

const (
	copiesRun    = "copies run"
	copiesNotRun = "copies not run (control plane only)"
)

// serveRound is one bench serve run's shape.
type serveRound struct {
	sessions, perStep, requests, maxPages int
	dir                                   string
	copies                                bool
	pageBytes                             int64  // 0: the embedded demo stack
	process                               bool   // rounds: serve in a child process
	traceFile                             string // with process: each child serve writes FILE.serve.N
	cpuProfile                            string // with process: each child serve writes FILE.serve.N
	bgNice                                bool   // serve's --background-nice
	machinePerRank                        bool   // serve's --machine-per-rank
	ownerLanes                            bool   // serve's --owner-lanes
	// noPing: no empty Ping before each step (the CPU rounds: a Ping is
	// the latency rows' limit, not the engine's work, and N sessions
	// would add N of them to every step's CPU).
	noPing bool
	// pings > 0: instead of the workload, the round's sessions make an
	// empty Ping call each, in lockstep, pings times (a Result with a
	// step a call): serve's CPU per call, the floor of a rank's step.
	pings int
}

// yaml is the embedded demo stack, or with pageBytes set that stack with
// pages of pageBytes per kind, sized in pages so a run at the seed's
// geometry (2.75 MiB pages) stays within a few GiB: an L1 of 2x maxPages,
// an L2 of 6x and an L3 of 16x per rank.
func (o serveRound) yaml() (string, error) {
	y := serve.DefaultYAML()
	if o.pageBytes == 0 {
		return y, nil
	}
	l1 := 2 * o.maxPages
	kib := func(pages int) string { return fmt.Sprintf("%dKiB", int64(pages)*o.pageBytes>>10) }
	for _, r := range []struct{ old, new string }{
		{"page_bytes: 16KiB", "page_bytes: " + kib(1)},
		{"config: {pages: 256, layers: 1}", fmt.Sprintf("config: {pages: %d, layers: 1}", l1)},
		{"config: {size: 16MiB,", "config: {size: " + kib(6*o.maxPages) + ","},
		{"budget: 256MiB}", "budget: " + kib(16*o.maxPages) + "}"},
	} {
		if !strings.Contains(y, r.old) {
			return "", fmt.Errorf("the embedded stack has no %q to resize", r.old)
		}
		y = strings.Replace(y, r.old, r.new, 1)
	}
	return y, nil
}

func (o serveRound) geometry() string {
	lanes := ""
	if o.ownerLanes {
		lanes = "; owner lanes (each rank moves its own pages)"
	}
	if o.pageBytes == 0 {
		return fmt.Sprintf("demo stack (16 KiB pages), requests of at most %d pages%s", o.maxPages, lanes)
	}
	return fmt.Sprintf("%s pages, per rank L1 %d pages, L2 %d, L3 %d; requests of at most %d pages%s",
		quantity.Size(o.pageBytes), 2*o.maxPages, 6*o.maxPages, 16*o.maxPages, o.maxPages, lanes)
}

// stackYAML is the round's stack with L3 l3 (l3disk, memstore or none).
func (o serveRound) stackYAML(l3 string) (string, error) {
	yaml, err := o.yaml()
	if err != nil {
		return "", fmt.Errorf("bench serve: %w", err)
	}
	switch l3 {
	case "l3disk":
	case "memstore", "none":
		i := strings.Index(yaml, "  - name: l3\n")
		j := strings.Index(yaml, "policy:")
		if i < 0 || j < i {
			return "", fmt.Errorf("bench serve: the embedded stack has no l3 entry to replace")
		}
		repl := ""
		if l3 == "memstore" {
			repl = "  - name: l3\n    role: store\n    use: memstore\n    config: {capacity: 256MiB}\n"
		}
		yaml = yaml[:i] + repl + yaml[j:]
	default:
		return "", fmt.Errorf("bench serve: --l3 %q: want l3disk, memstore or none: %w", l3, errUsage)
	}
	return yaml, nil
}

// workload is the round's generated requests.
func (o serveRound) workload() ([]workload.Request, error) {
	g := workload.DefaultGeneratorConfig()
	g.Requests = o.requests
	reqs, err := workload.Generate(g)
	if err != nil {
		return nil, fmt.Errorf("bench serve: %w", err)
	}
	return reqs, nil
}

// loadgenConfig is the round's loadgen against the socket sock.
func (o serveRound) loadgenConfig(sock string, reqs []workload.Request) loadgen.Config {
	return loadgen.Config{Socket: sock, Ranks: o.sessions, Requests: reqs,
		PerStep: o.perStep, MaxLive: 2 * o.perStep, MaxPages: o.maxPages, Ping: !o.noPing, NoPayload: true, NoCopies: !o.copies}
}

// checked returns res, or an error when loadgen saw errors or wrong bytes.
func checked(res loadgen.Result) (loadgen.Result, error) {
	if res.Errors != 0 {
		return loadgen.Result{}, fmt.Errorf("bench serve: %d errors (first: %s)", res.Errors, res.FirstError)
	}
	if res.WrongBytes != 0 {
		return loadgen.Result{}, fmt.Errorf("bench serve: %d wrong bytes", res.WrongBytes)
	}
	return res, nil
}

// run starts a serve with L3 l3 (l3disk, memstore or none), drives the
// workload through it and stops it.
func (o serveRound) run(ctx context.Context, l3 string) (loadgen.Result, error) {
	data, err := os.MkdirTemp(o.dir, "kvtier-bench-serve-")
	if err != nil {
		return loadgen.Result{}, fmt.Errorf("bench serve: %w", err)
	}
	defer os.RemoveAll(data)
	sd, err := os.MkdirTemp("", "kbs")
	if err != nil {
		return loadgen.Result{}, fmt.Errorf("bench serve: %w", err)
	}
	defer os.RemoveAll(sd)
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	yaml, err := o.stackYAML(l3)
	if err != nil {
		return loadgen.Result{}, err
	}
	s, err := serve.Open(sctx, serve.Config{YAML: yaml, ConfigName: "bench stack (--l3 " + l3 + ")", DataDir: data, Socket: filepath.Join(sd, "s.sock"), Ranks: o.sessions,
		OwnerLanes: o.ownerLanes, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return loadgen.Result{}, fmt.Errorf("bench serve: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(sctx) }()
	select {
	case <-s.Listening():
	case err := <-done:
		return loadgen.Result{}, fmt.Errorf("bench serve: %w", err)
	}
	reqs, err := o.workload()
	if err != nil {
		return loadgen.Result{}, err
	}
	res, err := loadgen.Run(ctx, o.loadgenConfig(filepath.Join(sd, "s.sock"), reqs))
	stop()
	if serr := <-done; serr != nil && err == nil {
		err = serr
	}
	if err != nil {
		return loadgen.Result{}, fmt.Errorf("bench serve: %w", err)
	}
	return checked(res)
}

// runOnce runs one round, its serve in the bench process or (o.process)
// in a child process.
func (o serveRound) runOnce(ctx context.Context, l3 string) (loadgen.Result, error) {
	if !o.process {
		if o.bgNice {
			enableBackgroundNice()
		}
		return o.run(ctx, l3)
	}
	exe, err := os.Executable()
	if err != nil {
		return loadgen.Result{}, fmt.Errorf("bench serve: %w", err)
	}
	_, _, res, err := o.runChild(ctx, exe, l3, nil)
	return res, err
}

// benchServeRounds alternates rounds with L3 l3 and without L3, each a
// fresh serve over the same workload, and reports the median over the
// rounds of each one's step p99 and the ratio nol3/l3 (1: L3 costs a step
// nothing; the target is 0.8).
func benchServeRounds(ctx context.Context, o serveRound, l3 string, rounds int, stdout io.Writer, asJSON bool) error {
	var withL3, without []float64
	var l3Hits int64
	for i := range 2 * rounds {
		tier := l3
		if i%2 == 1 {
			tier = "none"
		}
		res, err := o.runOnce(ctx, tier)
		if err != nil {
			return fmt.Errorf("round %d (--l3 %s): %w", i/2+1, tier, err)
		}
		if tier == "none" {
			without = append(without, res.StepUsP99)
		} else {
			withL3 = append(withL3, res.StepUsP99)
			l3Hits += res.HitTokensByTier["l3"]
		}
	}
	a, b := median(withL3), median(without)
	what := copiesRun
	if !o.copies {
		what = copiesNotRun
	}
	where := "in the bench process"
	if o.process {
		where = "its own process"
	}
	note := fmt.Sprintf("%d alternating rounds each, a fresh serve (%s) a round; %s; %s; %d sessions, %d new requests a step, %d requests; median of the rounds' p99; L3 hit tokens over the L3 rounds %d; %s",
		rounds, where, what, o.geometry(), o.sessions, o.perStep, o.requests, l3Hits, loadNote())
	rows := []benchreport.Result{
		{Bench: "serve/step_p99_l3", Value: a, Unit: "us", Note: fmt.Sprintf("L3 %s, rounds %v", l3, roundUs(withL3))},
		{Bench: "serve/step_p99_nol3", Value: b, Unit: "us", Note: fmt.Sprintf("no L3, rounds %v", roundUs(without))},
	}
	r := benchreport.Result{Bench: "serve/step_p99_ratio", Value: a, Unit: "us", Limit: b, LimitName: "step p99 without L3, same run", Target: 0.8, Note: note}
	if a > 0 {
		r.Ratio = b / a
	}
	rows = append(rows, r)
	return benchreport.Write(stdout, rows, asJSON)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func roundUs(v []float64) []int64 {
	out := make([]int64, len(v))
	for i, x := range v {
		out[i] = int64(x)
	}
	return out
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"

	"github.com/kvtier/kvtier/host/serve"
	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/kvtier/kvtier/internal/loadgen"
	"github.com/kvtier/kvtier/workload"
)

// runBenchServe is `kvtier bench serve`: an in-process kvtier serve on the
// embedded demo stack with one rank per session, driven by loadgen's
// sessions in lockstep, each step holding up to per-step new requests
// (and the stores and finishes of earlier ones); before every step each
// session times an empty Ping on the same socket, the limit.
func runBenchServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvtier bench serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sessions := fs.Int("sessions", 8, "rank sessions (serve ranks)")
	perStep := fs.Int("per-step", 32, "new requests per step")
	requests := fs.Int("requests", 4000, "requests of the generated workload")
	dir := fs.String("dir", os.TempDir(), "`directory` for the ranks' L3 and indexes")
	l3 := fs.String("l3", "l3disk", "the ranks' L3: l3disk (the embedded demo stack), memstore (in RAM) or none")
	asJSON := fs.Bool("json", false, "print one JSON object per line")
	copies := fs.Bool("copies", true, "run the engine's copies in the bench process (false: report plans done without copying, the control plane alone)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run to `file`")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("bench serve: %w: %w", err, errUsage)
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("bench serve: unexpected arguments %q: %w", fs.Args(), errUsage)
	case *sessions < 1 || *sessions > 64:
		return fmt.Errorf("bench serve: --sessions %d: want 1..64: %w", *sessions, errUsage)
	case *perStep < 1 || *perStep > 4096:
		return fmt.Errorf("bench serve: --per-step %d: want 1..4096: %w", *perStep, errUsage)
	case *requests < 1 || *requests > 1_000_000:
		return fmt.Errorf("bench serve: --requests %d: want 1..1000000: %w", *requests, errUsage)
	}
	data, err := os.MkdirTemp(*dir, "kvtier-bench-serve-")
	if err != nil {
		return fmt.Errorf("bench serve: %w", err)
	}
	defer os.RemoveAll(data)
	sd, err := os.MkdirTemp("", "kbs")
	if err != nil {
		return fmt.Errorf("bench serve: %w", err)
	}
	defer os.RemoveAll(sd)
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	yaml := serve.DefaultYAML()
	switch *l3 {
	case "l3disk":
	case "memstore", "none":
		i := strings.Index(yaml, "  - name: l3\n")
		j := strings.Index(yaml, "policy:")
		if i < 0 || j < i {
			return fmt.Errorf("bench serve: the embedded stack has no l3 entry to replace")
		}
		repl := ""
		if *l3 == "memstore" {
			repl = "  - name: l3\n    role: store\n    use: memstore\n    config: {capacity: 256MiB}\n"
		}
		yaml = yaml[:i] + repl + yaml[j:]
	default:
		return fmt.Errorf("bench serve: --l3 %q: want l3disk, memstore or none: %w", *l3, errUsage)
	}
	s, err := serve.Open(sctx, serve.Config{YAML: yaml, ConfigName: "bench stack (--l3 " + *l3 + ")", DataDir: data, Socket: filepath.Join(sd, "s.sock"), Ranks: *sessions,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return fmt.Errorf("bench serve: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(sctx) }()
	select {
	case <-s.Listening():
	case err := <-done:
		return fmt.Errorf("bench serve: %w", err)
	}
	g := workload.DefaultGeneratorConfig()
	g.Requests = *requests
	reqs, err := workload.Generate(g)
	if err != nil {
		return fmt.Errorf("bench serve: %w", err)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("bench serve: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("bench serve: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	res, err := loadgen.Run(ctx, loadgen.Config{Socket: filepath.Join(sd, "s.sock"), Ranks: *sessions, Requests: reqs,
		PerStep: *perStep, MaxLive: 2 * *perStep, Ping: true, NoPayload: true, NoCopies: !*copies})
	stop()
	if serr := <-done; serr != nil && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("bench serve: %w", err)
	}
	if res.Errors != 0 {
		return fmt.Errorf("bench serve: %d errors (first: %s)", res.Errors, res.FirstError)
	}
	what := "copies run"
	if !*copies {
		what = "copies not run (control plane only)"
	}
	note := fmt.Sprintf("L3 %s, %s; %d sessions in lockstep (one serve rank each), %d new requests a step, %d requests, %d steps; payloads not generated (loadgen verifies them); ratio = ping/step; %s",
		*l3, what, *sessions, *perStep, res.Requests, res.Steps, loadNote())
	lower := func(name string, v, limit float64, target float64) benchreport.Result {
		r := benchreport.Result{Bench: name, Value: v, Unit: "us", Limit: limit, LimitName: "empty gRPC call, same socket", Target: target, Note: note}
		if v > 0 {
			r.Ratio = limit / v
		}
		return r
	}
	rows := []benchreport.Result{
		lower("serve/step_p50", res.StepUsP50, res.PingUsP50, 0),
		lower("serve/step_p99", res.StepUsP99, res.PingUsP99, 2000),
		{Bench: "serve/step_max", Value: res.StepUsMax, Unit: "us", Note: note},
		benchreport.Result{Bench: "serve/load_gbps", Value: res.LoadGBps, Unit: "GB/s", Note: "engine copies slab -> L1 (mapped shm or hugetlbfs)"}.WithLimit("memcpy of the same pages, out of cache", res.MemcpyGBps),
		benchreport.Result{Bench: "serve/store_gbps", Value: res.StoreGBps, Unit: "GB/s", Note: "engine copies L1 -> slab"}.WithLimit("memcpy of the same pages, out of cache", res.MemcpyGBps),
		{Bench: "serve/hit_rate", Value: res.HitRate, Unit: "fraction", Note: "hit pages by serve's answers (bytes not generated here)"},
	}
	return benchreport.Write(stdout, rows, *asJSON)
}

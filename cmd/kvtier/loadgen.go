package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/kvtier/kvtier/loadgen"
	"github.com/kvtier/kvtier/workload"
	"github.com/spf13/cobra"
)

// newLoadgenCmd returns `kvtier loadgen`.
func newLoadgenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "loadgen [TRACE] --socket PATH --ranks N [flags]",
		Short: "drive a running kvtier serve with a trace: N rank sessions, every loaded byte verified",
		Long: `A synthetic engine of N rank sessions driving a running kvtier serve with a
trace (a Mooncake JSONL file, or the built-in generated workload): each rank
has an L1 pool in host memory, writes every placed page's payload, runs the
copy plans through the mapped slab, and verifies every loaded page byte for
byte. The ranks run the same requests in the same steps, as the ranks of a
context-parallel engine do. Prints the per-tier hit table, step latencies
and copy rates against an in-process memcpy of the same pages. Exits 1,
saying why, when a loaded byte was wrong, when any step or item errored,
or when no page was verified.`,
		Example: `  kvtier serve --socket /tmp/kvtier.sock --ranks 2 &
  kvtier loadgen --socket /tmp/kvtier.sock --ranks 2
  kvtier loadgen docs.jsonl --socket /tmp/kvtier.sock --ranks 2 --requests 0 --json`,
	}
	fs := cmd.Flags()
	socket := fs.String("socket", "", "serve's unix socket `path` (required)")
	ranks := fs.Int("ranks", 1, "rank sessions (serve's rank count)")
	requests := fs.Int("requests", 2000, "requests to run (0: the whole trace)")
	perStep := fs.Int("per-step", 8, "new requests looked up per step")
	maxLive := fs.Int("max-live", 32, "requests in flight per rank")
	maxPages := fs.Int("max-pages", 64, "pages per request at most (longer prompts are cut)")
	seed := fs.Uint64("seed", 1, "seed of the built-in generated workload")
	asJSON := fs.Bool("json", false, "print one JSON object")
	ping := fs.Bool("ping", false, "time an empty call (Ping) on the same socket before every step: the floor of the step latency")
	writeTrace := fs.String("write-trace", "", "write the requests run, each cut to --max-pages pages, as a Mooncake JSONL `file` (kvtier replay FILE gives their hit-rate bounds)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		stdout := cmd.OutOrStdout()
		switch {
		case *socket == "":
			return fmt.Errorf("loadgen: --socket is required: %w", errUsage)
		case fs.NArg() > 1:
			return fmt.Errorf("loadgen: one trace at most, got %q: %w", fs.Args(), errUsage)
		case *ranks < 1 || *ranks > 64:
			return fmt.Errorf("loadgen: --ranks %d: want 1..64: %w", *ranks, errUsage)
		case *requests < 0 || *requests > 10_000_000:
			return fmt.Errorf("loadgen: --requests %d: want 0..10000000: %w", *requests, errUsage)
		case *perStep < 1 || *perStep > 4096:
			return fmt.Errorf("loadgen: --per-step %d: want 1..4096: %w", *perStep, errUsage)
		case *maxLive < 1 || *maxLive > 65536:
			return fmt.Errorf("loadgen: --max-live %d: want 1..65536: %w", *maxLive, errUsage)
		case *maxPages < 1 || *maxPages > 65536:
			return fmt.Errorf("loadgen: --max-pages %d: want 1..65536: %w", *maxPages, errUsage)
		}
		var reqs []workload.Request
		var err error
		source := "the built-in generated workload"
		if fs.NArg() == 1 {
			source = fs.Arg(0)
			if reqs, err = workload.ReadFile(fs.Arg(0)); err != nil {
				return fmt.Errorf("loadgen: %w", err)
			}
		} else {
			g := workload.DefaultGeneratorConfig()
			g.Seed = *seed
			if *requests > 0 {
				g.Requests = *requests
			}
			if reqs, err = workload.Generate(g); err != nil {
				return fmt.Errorf("loadgen: %w", err)
			}
		}
		if *requests > 0 && *requests < len(reqs) {
			reqs = reqs[:*requests]
		}
		if *writeTrace != "" {
			if err := writeCutTrace(*writeTrace, reqs, *maxPages); err != nil {
				return fmt.Errorf("loadgen: --write-trace: %w", err)
			}
		}
		res, err := loadgen.Run(ctx, loadgen.Config{Socket: *socket, Ranks: *ranks, Requests: reqs, PerStep: *perStep, MaxLive: *maxLive, MaxPages: *maxPages, Ping: *ping})
		if err != nil {
			return err
		}
		if *asJSON {
			if err := json.NewEncoder(stdout).Encode(res); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(stdout, "%s: %d requests on %d rank(s), %d steps, %.1f s; pages of %d tokens, %d bytes; L1 %d pages per rank\n",
				source, res.Requests, res.Ranks, res.Steps, res.Seconds, res.PageTokens, res.PageBytes, res.L1Pages)
			fmt.Fprintf(stdout, "\n%-6s %14s %8s\n", "tier", "hit tokens", "share")
			for _, t := range []string{"l1", "l2", "l3"} {
				share := 0.0
				if res.InputTokens > 0 {
					share = float64(res.HitTokensByTier[t]) / float64(res.InputTokens)
				}
				fmt.Fprintf(stdout, "%-6s %14d %7.2f%%\n", t, res.HitTokensByTier[t], 100*share)
			}
			fmt.Fprintf(stdout, "%-6s %14d %7.2f%%  of %d input tokens\n", "total", res.HitTokens, 100*res.HitRate, res.InputTokens)
			fmt.Fprintf(stdout, "\nverified pages %d, wrong bytes %d, errors %d, restarts %d\n", res.VerifiedPages, res.WrongBytes, res.Errors, res.Restarts)
			fmt.Fprintf(stdout, "step latency p50 %.0f us, p99 %.0f us, max %.0f us\n", res.StepUsP50, res.StepUsP99, res.StepUsMax)
			if res.PingUsP50 > 0 {
				fmt.Fprintf(stdout, "empty call (Ping) on the same socket p50 %.0f us, p99 %.0f us (step/ping %.1fx, %.1fx)\n",
					res.PingUsP50, res.PingUsP99, res.StepUsP50/res.PingUsP50, res.StepUsP99/max(res.PingUsP99, 1))
			}
			fmt.Fprintf(stdout, "engine copies: load %.2f GB/s, store %.2f GB/s over the time spent copying; memcpy of as many bytes beside them %.2f GB/s (%.2fx, %.2fx); memcpy after the run, best of 5, %.2f GB/s\n",
				res.LoadGBps, res.StoreGBps, res.MemcpyGBps, res.LoadRatio, res.StoreRatio, res.MemcpyAfterGBps)
			fmt.Fprintf(stdout, "copying took %.1f%% of the run's wall time; %d plan items copied as %d runs\n", 100*res.CopyShare, res.CopyItems, res.CopyRuns)
			if res.FirstError != "" {
				fmt.Fprintf(stdout, "first error: %s\n", res.FirstError)
			}
		}
		// NB: main prints the verdict's error (why) and exits 1.
		return res.Check(true)
	}
	return cmd
}

// writeCutTrace writes reqs to path as loadgen runs them: each request's
// hash ids cut to maxPages pages and its input length to as many tokens,
// so a replay of the file counts the same tokens as loadgen does.
func writeCutTrace(path string, reqs []workload.Request, maxPages int) error {
	cut := make([]workload.Request, len(reqs))
	for i, r := range reqs {
		if len(r.HashIDs) > maxPages {
			r.HashIDs = r.HashIDs[:maxPages]
		}
		r.InputLength = min(r.InputLength, len(r.HashIDs)*workload.BlockTokens)
		cut[i] = r
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := workload.Write(f, cut); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}

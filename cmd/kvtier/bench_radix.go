package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/host/replay"
	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/kvtier/kvtier/workload"
	"github.com/spf13/cobra"
)

// defaultBenchTrace is where the Mooncake synthetic trace sits beside a
// kvtier checkout; bench radix falls back to the generated workload.
var defaultBenchTrace = filepath.Join("..", "shared", "traces", "mooncake_synthetic_trace.jsonl")

// newBenchRadixCmd returns `kvtier radix`.
func newBenchRadixCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "radix [flags]",
		Short: "the host path (radix tree, policy, clock) against a naive map+list LRU",
		Long: `Replays a trace through the host path (radix tree + policy + logical
clock, invariants off) on one core and reports block-ops/s against a naive
map+list LRU measured in the same run.`,
		Example: `  kvtier bench radix
  kvtier bench radix --json`,
	}
	fs := cmd.Flags()
	asJSON := fs.Bool("json", false, "print one JSON object per line")
	tracePath := fs.String("trace", "", "Mooncake JSONL trace (default: "+defaultBenchTrace+" if present, else the generated workload)")
	policyName := fs.String("policy", "lru", "eviction policy of the host path")
	capacity := fs.String("capacity", "3M", "replay capacity in tokens")
	rounds := countFlag(fs, "rounds", 5, "timed `rounds` per side (the median counts)")
	minRound := fs.Duration("min-round", 300*time.Millisecond, "least time per round")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		stdout := cmd.OutOrStdout()
		if fs.NArg() != 0 {
			return fmt.Errorf("bench radix: unexpected arguments %v: %w", fs.Args(), errUsage)
		}
		caps, err := replay.ParseCapacities(*capacity)
		if err != nil || len(caps) != 1 || caps[0] == 0 {
			return fmt.Errorf("bench radix: --capacity wants one finite capacity (%v): %w", err, errUsage)
		}
		if *minRound <= 0 {
			return fmt.Errorf("bench radix: --min-round must be positive: %w", errUsage)
		}
		if err := roundsRange("rounds", int64(*rounds)).check(); err != nil {
			return fmt.Errorf("bench radix: %w: %w", err, errUsage)
		}
		path, note := *tracePath, ""
		if path == "" {
			if _, err := os.Stat(defaultBenchTrace); err == nil {
				path = defaultBenchTrace
			}
		}
		var tr *replay.Trace
		if path != "" {
			reqs, err := workload.ReadFile(path)
			if err != nil {
				return fmt.Errorf("bench radix: %w", err)
			}
			if tr, err = replay.Compile(path, reqs); err != nil {
				return fmt.Errorf("bench radix: %w", err)
			}
			note = "trace " + filepath.Base(path)
		} else {
			reqs, name, err := builtinWorkload()
			if err != nil {
				return fmt.Errorf("bench radix: %w", err)
			}
			if tr, err = replay.Compile(name, reqs); err != nil {
				return fmt.Errorf("bench radix: %w", err)
			}
			note = "generated workload (trace " + defaultBenchTrace + " absent)"
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		policies, err := builtin.Policies()
		if err != nil {
			return fmt.Errorf("bench radix: %w", err)
		}
		r, err := replay.Bench(tr, policies, replay.BenchConfig{
			Policy:         replay.Spec{Name: *policyName},
			CapacityTokens: caps[0],
			Rounds:         *rounds,
			MinRound:       *minRound,
			OneCore:        true,
		})
		if err != nil {
			return fmt.Errorf("bench radix: %w", err)
		}
		params := fmt.Sprintf("%s; %s at %s tokens; %d block-ops per replay; one core; median of %d rounds",
			note, r.Policy, replay.FormatCapacity(r.CapacityTokens), r.BlockOps, r.Rounds)
		results := []benchreport.Result{
			{
				Bench: "radix/replay", Value: r.HostOpsPerSec, Unit: "block-ops/s", Target: 10e6,
				Note: params + fmt.Sprintf("; hit rate %.2f%%; target value", 100*r.HostHitRate),
			},
			benchreport.Result{
				Bench: "radix/vs-naive-lru", Value: r.HostOpsPerSec, Unit: "block-ops/s", Target: 0.8,
				Note: fmt.Sprintf("naive map+container/list LRU over the same blocks (hit rate %.2f%%, no leaf-only constraint); target ratio", 100*r.NaiveHitRate),
			}.WithLimit("naive map+list LRU", r.NaiveOpsPerSec),
		}
		return benchreport.Write(stdout, results, *asJSON)
	}
	return cmd
}

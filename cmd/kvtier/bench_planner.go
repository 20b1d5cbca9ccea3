package main

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/kvtier/kvtier/internal/measure"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/planner"
	"github.com/spf13/cobra"
)

// plannerBytesPerCandidate is the memory of one candidate of a scenario:
// its nodes (about 1.3 per candidate, each with per-lane counts) and both
// planners' scratch (measured: about 820 bytes at 100k candidates).
const plannerBytesPerCandidate = 2 << 10

// newBenchPlannerCmd returns `kvtier planner`.
func newBenchPlannerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "planner [flags]",
		Short: "the eviction planners on a replay against the bare replay",
		Long: `Times the owner-lane eviction planners on the production scenario of
planner.BenchScenarios (2,000 candidates, a 7,877-page deficit) at cp_size
1, 4 and 8: the heap planner against the greedy reference in the same run,
after checking that both choose the same plan.`,
		Example: `  kvtier bench planner
  kvtier bench planner --json`,
	}
	fs := cmd.Flags()
	asJSON := fs.Bool("json", false, "print one JSON object per line")
	minTime := fs.Duration("min-time", 500*time.Millisecond, "time spent measuring each planner per scenario, over all rounds")
	rounds := countFlag(fs, "rounds", 5, "alternating timed `rounds` per planner (the median counts)")
	candidates := countFlag(fs, "candidates", 2000, "`number` of evictable leaves per scenario")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		stdout := cmd.OutOrStdout()
		if fs.NArg() != 0 {
			return fmt.Errorf("bench planner: unexpected arguments %v: %w", fs.Args(), errUsage)
		}
		if *minTime <= 0 {
			return fmt.Errorf("bench planner: --min-time must be positive: %w", errUsage)
		}
		m := machineOf(ctx)
		if err := checkRanges(
			m.memoryRange("candidates", int64(*candidates), 1, plannerBytesPerCandidate, 0, "candidate"),
			roundsRange("rounds", int64(*rounds)),
		); err != nil {
			return fmt.Errorf("bench planner: %w: %w", err, errUsage)
		}
		var results []benchreport.Result
		for _, sc := range planner.BenchScenarios() {
			sc.Candidates = *candidates
			in := sc.Build()
			greedy, heap := planner.NewGreedy(), planner.NewHeap()
			gp, err := greedy.Plan(in)
			if err != nil {
				return fmt.Errorf("bench planner %s: greedy: %w", sc.Label(), err)
			}
			hp, err := heap.Plan(in)
			if err != nil {
				return fmt.Errorf("bench planner %s: heap: %w", sc.Label(), err)
			}
			if !slices.Equal(gp.Victims, hp.Victims) || !slices.Equal(gp.Remaining, hp.Remaining) {
				return fmt.Errorf("bench planner %s: heap and greedy plans differ (a bug: the property test should have caught it)", sc.Label())
			}
			ts, err := timePlans(ctx, []policy.Planner{greedy, heap}, in, *minTime/time.Duration(*rounds), *rounds)
			if err != nil {
				return err
			}
			gms, hms := ts[0].Seconds()*1e3, ts[1].Seconds()*1e3
			note := fmt.Sprintf("%d nodes, %d victims", len(in.Nodes), len(hp.Victims))
			results = append(results,
				benchreport.Result{Bench: "planner/greedy/" + sc.Label(), Value: gms, Unit: "ms", Note: note + "; reference"},
				benchreport.Result{
					Bench: "planner/heap/" + sc.Label(), Value: hms, Unit: "ms",
					Limit: gms, LimitName: "greedy", Ratio: gms / hms, Target: 30,
					Note: note + "; CPU ms per call, median of alternating rounds, one P; ratio = greedy/heap (speedup); target heap <= 2 ms single-owner, >= 30x",
				})
		}
		return benchreport.Write(stdout, results, *asJSON)
	}
	return cmd
}

// timePlans times planners on in: rounds alternate between them so both
// see the same machine state, each round runs one planner for at least
// round (and at least 3 calls) and measures CPU time of the process per
// call (user + system, GC included; the process is pinned to one P while
// it runs). The median round counts. On a shared machine the wall clock
// also counts time spent waiting for a core, which says nothing about the
// code; CPU time does not.
func timePlans(ctx context.Context, ps []policy.Planner, in policy.PlanInput, round time.Duration, rounds int) ([]time.Duration, error) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	per := make([][]time.Duration, len(ps))
	for _, p := range ps {
		for i := 0; i < 3; i++ { // warm scratch space and caches
			if _, err := p.Plan(in); err != nil {
				return nil, fmt.Errorf("bench planner: %s: %w", p.Name(), err)
			}
		}
	}
	for r := 0; r < rounds; r++ {
		for k, p := range ps {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("bench planner: %w", err)
			}
			runtime.GC()
			n := 0
			start, cpu0 := time.Now(), measure.ProcessCPU()
			for n < 3 || time.Since(start) < round {
				if _, err := p.Plan(in); err != nil {
					return nil, fmt.Errorf("bench planner: %s: %w", p.Name(), err)
				}
				n++
			}
			elapsed := measure.ProcessCPU() - cpu0
			if elapsed <= 0 {
				elapsed = time.Since(start)
			}
			per[k] = append(per[k], elapsed/time.Duration(n))
		}
	}
	out := make([]time.Duration, len(ps))
	for k := range per {
		slices.Sort(per[k])
		out[k] = per[k][len(per[k])/2]
	}
	return out, nil
}

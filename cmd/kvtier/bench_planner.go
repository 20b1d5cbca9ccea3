package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/planner"
)

// runBenchPlanner times the owner-lane eviction planners on the seed's
// scenario (2,000 candidates, a 7,877-page deficit) at cp_size 1, 4 and 8:
// the heap planner against the greedy reference in the same run, after
// checking that both choose the same plan.
func runBenchPlanner(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench planner", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print one JSON object per line")
	minTime := fs.Duration("min-time", 300*time.Millisecond, "time spent measuring each planner per scenario")
	candidates := fs.Int("candidates", 2000, "evictable leaves per scenario")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("bench planner: %w: %w", err, errUsage)
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("bench planner: unexpected arguments %v: %w", fs.Args(), errUsage)
	}
	if *candidates <= 0 || *minTime <= 0 {
		return fmt.Errorf("bench planner: --candidates and --min-time must be positive: %w", errUsage)
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
		gt, err := timePlan(ctx, greedy, in, *minTime)
		if err != nil {
			return err
		}
		ht, err := timePlan(ctx, heap, in, *minTime)
		if err != nil {
			return err
		}
		gms, hms := seconds(gt)*1e3, seconds(ht)*1e3
		note := fmt.Sprintf("%d nodes, %d victims", len(in.Nodes), len(hp.Victims))
		results = append(results,
			benchreport.Result{Bench: "planner/greedy/" + sc.Label(), Value: gms, Unit: "ms", Note: note + "; reference"},
			benchreport.Result{
				Bench: "planner/heap/" + sc.Label(), Value: hms, Unit: "ms",
				Limit: gms, LimitName: "greedy", Ratio: gms / hms, Target: 30,
				Note: note + "; ratio = greedy/heap (speedup); target heap <= 2 ms single-owner, >= 30x",
			})
	}
	return benchreport.Write(stdout, results, *asJSON)
}

func seconds(d time.Duration) float64 { return d.Seconds() }

// timePlan returns the median time of one Plan call over runs spanning at
// least minTime (and at least 5 runs). The median resists the noise of
// other processes on a shared machine.
func timePlan(ctx context.Context, p policy.Planner, in policy.PlanInput, minTime time.Duration) (time.Duration, error) {
	for i := 0; i < 3; i++ { // warm scratch space and caches
		if _, err := p.Plan(in); err != nil {
			return 0, fmt.Errorf("bench planner: %s: %w", p.Name(), err)
		}
	}
	var runs []time.Duration
	start := time.Now()
	for len(runs) < 5 || time.Since(start) < minTime {
		if err := ctx.Err(); err != nil {
			return 0, fmt.Errorf("bench planner: %w", err)
		}
		t0 := time.Now()
		if _, err := p.Plan(in); err != nil {
			return 0, fmt.Errorf("bench planner: %s: %w", p.Name(), err)
		}
		runs = append(runs, time.Since(t0))
	}
	slices.Sort(runs)
	return runs[len(runs)/2], nil
}

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/host/replay"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/workload"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// newReplayCmd returns `kvtier replay`.
func newReplayCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "replay [TRACE] [flags]",
		Short: "replay a trace through the radix tree and eviction policies",
		Long: `Replays a Mooncake-format trace (or, without TRACE, the built-in generated
workload) through the radix tree in metadata mode and prints, per capacity
and policy, the token hit rate, hit and input tokens, evictions, node count
and why blocks missed, with the Belady and infinite-capacity bounds as rows.
One trace block is one 512-token page; capacity in blocks = floor(tokens/512).
Per request: prefix hit = the longest run of leading blocks present; hit
tokens = min(512 x hit blocks, input_length); then the whole input is
inserted with the request's own blocks locked, evicting leaves (trimmed from
the tail when only part is needed). A request longer than the capacity
inserts only the leading blocks that fit; the rest count as NOT ADMITTED.
With --lookahead N, the present pages of the next N requests (the engine's
waiting queue) are locked against eviction while each request is replayed;
the running request still comes first (docs/policies.md).

With --data the trace runs with bytes through a whole opened stack, every
hit read from L1 and verified, and the engine steps: each step admits up
to --step-requests new requests (fewer when their pages and those of the
requests waiting on a reload would not fit in L1), matches them and the
requests whose reload landed, ticks so the load-backs commit, prefills
them all and ticks again. Requests of one step match before any of them
inserts, as in an engine's batch.`,
		Example: `  kvtier replay --policy lru --vs s3fifo,slru
  kvtier replay docs.jsonl --policy lru --vs s3fifo --sweep --plot plots/docs
  kvtier replay docs.jsonl --policy lru --lookahead 32 --capacity 1M,3M,inf --json
  kvtier replay --data --requests 2000 --cold-start load
  kvtier replay --data --requests 2000 --step-requests 1`,
	}
	fs := cmd.Flags()
	configPath := fs.String("config", "", "stack config YAML (default: the embedded default stack)")
	policyName := fs.String("policy", "", "eviction policy (default: the config's policy)")
	vs := fs.String("vs", "", "comma-separated policies replayed side by side with --policy")
	capacity := fs.String("capacity", "", "comma-separated capacities in tokens: 3000000, 3M, 1.5M, inf (default 1M,3M,10M,inf)")
	asJSON := fs.Bool("json", false, "print one JSON object per line, one per (policy, capacity)")
	sweep := fs.Bool("sweep", false, "replay a log-spaced sweep of capacities (working set / 256 up to the working set) and write a hit-rate plot")
	points := countFlag(fs, "sweep-points", 12, "with --sweep: `number` of capacities (at least 2)")
	plotPrefix := fs.String("plot", defaultPlotPrefix, "with --sweep: write the plot to PREFIX.png and PREFIX.svg (PREFIX's directory must exist; the default's plots/ is created)")
	parallel := countFlag(fs, "parallel", 0, "`number` of replays run at once, one tree replica each, at least 1 (default: GOMAXPROCS)")
	lookahead := countFlag(fs, "lookahead", 0, "the engine's waiting queue as an eviction hint: while a request is replayed, the pages of the next `number` requests that were present when each entered the queue are locked against eviction (0: off)")
	df := addDataFlags(fs)

	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		stdout := cmd.OutOrStdout()
		stderr := cmd.ErrOrStderr()
		positional := fs.Args()
		if len(positional) > 1 {
			return fmt.Errorf("replay: want at most one TRACE, got %q: %w", positional, errUsage)
		}
		if df.data && fs.Changed("lookahead") {
			return fmt.Errorf("replay: --lookahead applies to the metadata replay, not to --data: %w", errUsage)
		}
		if !df.data && fs.Changed("step-requests") {
			return fmt.Errorf("replay: --step-requests applies to --data (the metadata replay has no engine steps): %w", errUsage)
		}
		if df.data {
			return runReplayData(ctx, fs, df, positional, *configPath, *asJSON, stdout, stderr)
		}
		if *capacity != "" && *sweep {
			return fmt.Errorf("replay: --capacity and --sweep exclude each other: %w", errUsage)
		}
		if err := checkReplayFlags(fs, *capacity, *points, *parallel); err != nil {
			return fmt.Errorf("replay: %w: %w", err, errUsage)
		}
		if err := (flagRange{Flag: "lookahead", Value: int64(*lookahead), Min: 0, MinWhy: "0 is off", Max: int64(^uint(0) >> 1)}).check(); err != nil {
			return fmt.Errorf("replay: %w: %w", err, errUsage)
		}
		plotExplicit := fs.Changed("plot")
		if err := checkPlotPrefix(*plotPrefix, plotExplicit); err != nil {
			return fmt.Errorf("replay: %w: %w", err, errUsage)
		}

		policies, err := builtin.Policies()
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		stack, err := loadStack(*configPath, policies)
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		if pt := stack.Payload.PageTokens; pt != workload.BlockTokens {
			return fmt.Errorf("replay: config page_tokens is %d, but replay maps one %d-token trace block to one page: set model.page_tokens: %d", pt, workload.BlockTokens, workload.BlockTokens)
		}
		specs, err := policySpecs(stack, *policyName, *vs)
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}

		tr, err := loadTrace(positional)
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}

		capacities := replay.DefaultCapacities()
		capacityFlag, given := "capacity", len(capacities)
		switch {
		case *sweep:
			if err := checkSweepPoints(tr, *points); err != nil {
				return fmt.Errorf("replay: %w: %w", err, errUsage)
			}
			capacities = replay.SweepCapacities(tr, *points)
			capacityFlag, given = "sweep-points", *points
		case *capacity != "":
			if capacities, err = replay.ParseCapacities(*capacity); err != nil {
				return fmt.Errorf("replay: --capacity: %w: %w", err, errUsage)
			}
			given = len(capacities)
		}
		plan := replay.Plan{
			Policies:   specs,
			Capacities: capacities,
			Belady:     true,
			Infinite:   true,
			Parallel:   *parallel,
			Breakdown:  true,
			Lookahead:  *lookahead,
		}
		if err := checkReplayMemory(machineOf(ctx), tr, plan, capacityFlag, given); err != nil {
			return fmt.Errorf("replay: %w: %w", err, errUsage)
		}
		var bar *progressbar.ProgressBar
		if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			bar = progressbar.NewOptions64(int64(plan.Jobs()*tr.Requests()),
				progressbar.OptionSetWriter(stderr),
				progressbar.OptionSetDescription(fmt.Sprintf("replay %d runs", plan.Jobs())),
				progressbar.OptionShowCount(),
				progressbar.OptionThrottle(100*time.Millisecond),
				progressbar.OptionClearOnFinish())
			plan.Progress = func(n int) { _ = bar.Add(n) }
		}
		results, err := replay.RunPlan(ctx, tr, policies, plan)
		if bar != nil {
			_ = bar.Finish()
		}
		if err != nil {
			return fmt.Errorf("replay %s: %w", tr.Name, err)
		}
		if *sweep {
			title := fmt.Sprintf("token hit rate vs capacity: %s", filepath.Base(tr.Name))
			files, err := writeSweepPlot(results, title, *plotPrefix, plotExplicit)
			if err != nil {
				return fmt.Errorf("replay: %w", err)
			}
			fmt.Fprintf(stderr, "wrote %s\n", strings.Join(files, ", "))
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			for _, r := range results {
				if err := enc.Encode(r); err != nil {
					return fmt.Errorf("replay: write json: %w", err)
				}
			}
			return nil
		}
		return writeReplayTable(stdout, tr, results)
	}
	return cmd
}

// loadStack returns the stack at path, or the embedded default.
func loadStack(path string, policies *policy.Registry) (*config.Stack, error) {
	tiersReg, err := builtin.Tiers()
	if err != nil {
		return nil, err
	}
	indexReg, err := builtin.Indexes()
	if err != nil {
		return nil, err
	}
	mods := config.Modules{Tiers: tiersReg, Indexes: indexReg, Policies: policies}
	if path == "" {
		return config.Default(mods)
	}
	return config.LoadFile(path, mods)
}

// policySpecs returns the primary policy (--policy, else the config's,
// with the config's params when it is the config's policy) followed by
// the --vs policies, without repeats.
func policySpecs(stack *config.Stack, primary, vs string) ([]replay.Spec, error) {
	if primary == "" {
		primary = stack.Policy.Evictor
	}
	var specs []replay.Spec
	seen := map[string]bool{}
	add := func(name string) error {
		name = strings.TrimSpace(name)
		if name == "" {
			return fmt.Errorf("--vs: empty policy name in %q", vs)
		}
		if name == replay.Infinite {
			return fmt.Errorf("policy %q is the infinite bound, always printed", name)
		}
		if seen[name] {
			return nil
		}
		seen[name] = true
		s := replay.Spec{Name: name}
		if name == stack.Policy.Evictor {
			s.Params = stack.Policy.Params
		}
		specs = append(specs, s)
		return nil
	}
	if err := add(primary); err != nil {
		return nil, err
	}
	if vs != "" {
		for _, n := range strings.Split(vs, ",") {
			if err := add(n); err != nil {
				return nil, err
			}
		}
	}
	return specs, nil
}

// loadTrace reads and compiles the trace file, or generates the built-in
// workload when no file is given.
func loadTrace(positional []string) (*replay.Trace, error) {
	if len(positional) == 0 {
		reqs, name, err := builtinWorkload()
		if err != nil {
			return nil, err
		}
		return replay.Compile(name, reqs)
	}
	reqs, err := workload.ReadFile(positional[0])
	if err != nil {
		return nil, err
	}
	return replay.Compile(positional[0], reqs)
}

// builtinWorkload is the embedded default workload: the seeded generator
// with its default config.
func builtinWorkload() ([]workload.Request, string, error) {
	cfg := workload.DefaultGeneratorConfig()
	reqs, err := workload.Generate(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("generate the built-in workload: %w", err)
	}
	return reqs, fmt.Sprintf("generated (seed %d, %d requests)", cfg.Seed, cfg.Requests), nil
}

func writeReplayTable(w io.Writer, tr *replay.Trace, results []replay.Result) error {
	fmt.Fprintf(w, "trace %s: %d requests, %d blocks (%d unique), %d input tokens\n\n",
		tr.Name, tr.Requests(), tr.Blocks(), tr.UniqueBlocks(), tr.InputTokens())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "POLICY\tCAPACITY\tBLOCKS\tHIT RATE\tHIT TOKENS\tINPUT TOKENS\tEVICTIONS\tNODES\tMISS: NEVER SEEN\tEVICTED\tEVICTED TAIL\tNOT ADMITTED\t")
	for _, r := range results {
		blocks := "-"
		if r.CapacityBlocks > 0 {
			blocks = fmt.Sprint(r.CapacityBlocks)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f%%\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n",
			r.Policy, replay.CapacityLabel(r.CapacityTokens), blocks, 100*r.HitRate, r.HitTokens, r.InputTokens,
			r.Evictions, r.Nodes, r.Misses.NeverSeen, r.Misses.Evicted, r.Misses.EvictedTail, r.Misses.NotAdmitted)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("replay: write table: %w", err)
	}
	fmt.Fprintln(w, "\nevictions and misses are in blocks (512-token pages); belady and infinite are bounds")
	return nil
}

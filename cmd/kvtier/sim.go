package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvtier/kvtier/host/consensus/simgroup"
	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/host/simrun"
	"github.com/spf13/cobra"
)

// newSimCmd returns `kvtier sim`.
func newSimCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sim [flags]",
		Short: "simulate a rank group (delays, faults, divergence) and check it never diverges or hangs",
		Long: `Runs N ranks, each a control Machine and a host.Node over real in-process
tiers (host L1 pool, shm slab, memstore L3), over the simulated rank group
with a generated workload, as a context-parallel group (page i of a key
is rank i mod N's: only it writes, moves and verifies the page's bytes;
the others hold poison in its L1 pages; --replicate gives every rank every
page instead): random per-rank arrival delays, tier acks held
back up to --max-ack-skew ticks per rank, ok bits cleared at --fail-rate
(default 0: no injected op failures), and the faults of SPEC. Prints ranks,
ticks, digest_checks, divergences, hangs, failed_ops, max_ack_skew_ticks,
wrong_bytes, the L1 admissions, planner runs and capacity skips (and with
--inject-divergence, injected_at_tick and caught_at_tick).

Requests start while the tick is below --ticks and the last one runs to
its end; then every rank runs 4×(--max-ack-skew+4) more ticks so held acks
land: the ticks printed exceed --ticks by those. Failed ops are the ok
bits --fail-rate cleared plus the ops the ranks' tiers failed.

With --nodes M the ranks are spread over M simulated nodes, N/M each: the
ranks of a node share one control Machine (host.Multi), which carries
each decision out on every rank's own tiers and reduces what each rank
finished before it ticks, and the group exchange (with its delays,
faults and digest checks) runs between the nodes. Ack skew is then
reported between nodes; inside a node it is absorbed by the reduction.

SPEC is a comma-separated list of stall:RANK@TICK and crash:RANK@TICK
(with --nodes, RANK is a node: the group's member).`,
		Example: `  kvtier sim --ranks 4 --ticks 20000 --seed 3
  kvtier sim --ranks 8 --faults stall:2@500,crash:5@900 --fail-rate 0.001 --json
  kvtier sim --ranks 8 --nodes 2 --fail-rate 0.001`,
	}
	fs := cmd.Flags()
	ranks := fs.Int("ranks", 8, "group size (1..64)")
	nodes := fs.Int("nodes", 0, "simulated nodes the ranks are spread over, one Machine each (0: one per rank; must divide --ranks)")
	ticks := fs.Uint64("ticks", 100_000, "ticks to run")
	seed := fs.Uint64("seed", 1, "seed of the workload, delays and faults")
	skew := fs.Int("max-ack-skew", 8, "most ticks a tier ack is held back on a rank (0..1000)")
	failRate := fs.Float64("fail-rate", 0, "probability an ok bit of a rank's contribution is cleared, an injected op failure (0: none)")
	faults := fs.String("faults", "", "stall:RANK@TICK and crash:RANK@TICK, comma-separated")
	inject := fs.Uint64("inject-divergence", 0, "rank 0 (with --nodes, node 0) applies an extra event at this tick (0: never)")
	digestEvery := fs.Uint64("digest-every", 16, "digest interval in ticks")
	timeout := fs.Duration("timeout", 5*time.Second, "exchange deadline")
	replicate := fs.Bool("replicate", false, "every rank moves every page (data-parallel replicas) instead of its owner lane's (page i: rank i mod N)")
	evictAhead := fs.Float64("evict-ahead", control.DefaultEvictAhead, "share of L1 or L2 an eviction that must happen frees beyond its need (0..0.5; control.Options.EvictAhead)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		stdout := cmd.OutOrStdout()
		if fs.NArg() > 0 {
			return fmt.Errorf("sim: unexpected arguments %q: %w", fs.Args(), errUsage)
		}
		switch {
		case *ranks < 1 || *ranks > 64:
			return fmt.Errorf("sim: --ranks %d: want 1..64: %w", *ranks, errUsage)
		case *nodes < 0 || (*nodes > 0 && (*nodes > *ranks || *ranks%*nodes != 0)):
			return fmt.Errorf("sim: --nodes %d: want 0 or a divisor of --ranks %d: %w", *nodes, *ranks, errUsage)
		case *ticks < 1 || *ticks > 1<<32:
			return fmt.Errorf("sim: --ticks %d: want 1..2^32: %w", *ticks, errUsage)
		case *skew < 0 || *skew > 1000:
			return fmt.Errorf("sim: --max-ack-skew %d: want 0..1000: %w", *skew, errUsage)
		case !(*failRate >= 0 && *failRate <= 1):
			return fmt.Errorf("sim: --fail-rate %v: want 0..1: %w", *failRate, errUsage)
		case *digestEvery < 1 || *digestEvery > 1<<20:
			return fmt.Errorf("sim: --digest-every %d: want 1..2^20: %w", *digestEvery, errUsage)
		case *timeout < time.Millisecond || *timeout > time.Hour:
			return fmt.Errorf("sim: --timeout %s: want 1ms..1h: %w", *timeout, errUsage)
		case !(*evictAhead >= 0 && *evictAhead <= 0.5):
			return fmt.Errorf("sim: --evict-ahead %v: want 0..0.5: %w", *evictAhead, errUsage)
		}
		members := *ranks
		if *nodes > 0 {
			members = *nodes
		}
		fl, err := parseSimFaults(*faults, members)
		if err != nil {
			return fmt.Errorf("sim: --faults: %w: %w", err, errUsage)
		}
		res, err := simrun.Run(ctx, simrun.Config{Ranks: *ranks, Nodes: *nodes, Ticks: *ticks, Seed: *seed, MaxAckSkew: *skew, OpFailRate: *failRate,
			Faults: fl, InjectDivergence: *inject, DigestEvery: *digestEvery, Timeout: *timeout, Replicate: *replicate, EvictAhead: evictAhead})
		if err != nil {
			return err
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			return enc.Encode(res)
		}
		fmt.Fprintf(stdout, "ranks %d on %d nodes, ticks %d (%.0f/s), requests %d%s\n", res.Ranks, res.Nodes, res.Ticks, res.TicksPerSecond, res.Requests, simTicksNote(res.Ticks, *ticks, *skew))
		fmt.Fprintf(stdout, "digest checks %d, divergences %d, hangs %d, failed ops %d %s, max ack skew %d ticks\n",
			res.DigestChecks, res.Divergences, res.Hangs, res.FailedOps, simFailedOpsNote(res, *failRate), res.MaxAckSkewTicks)
		fmt.Fprintf(stdout, "verified pages %d, wrong bytes %d\n", res.VerifiedPages, res.WrongBytes)
		fmt.Fprintf(stdout, "L1 admissions %d, planner runs %d, capacity skips %d (evict ahead %g)\n", res.L1Admissions, res.L1Plans, res.L1CapacitySkips, res.EvictAhead)
		fmt.Fprintf(stdout, "owner lanes %v (pages in a rank's store that another lane owns: %d); bytes over all ranks: l1->l2 %d, l2->l3 %d, l3->l2 %d, l2->l1 %d\n",
			res.OwnerLanes, res.ForeignPages, res.L1ToL2, res.L2ToL3, res.L3ToL2, res.L2ToL1)
		if res.InjectedAtTick > 0 {
			fmt.Fprintf(stdout, "divergence injected at tick %d, caught at tick %d\n", res.InjectedAtTick, res.CaughtAtTick)
		}
		if res.StoppedBy != "" {
			fmt.Fprintf(stdout, "stopped by: %s\n", res.StoppedBy)
		}
		return nil
	}
	return cmd
}

// simTicksNote explains why a run's ticks exceed --ticks: requests start
// below it and run to their end, then the ranks drain the held acks.
func simTicksNote(ran, ticks uint64, maxAckSkew int) string {
	if ran <= ticks {
		return ""
	}
	return fmt.Sprintf("; ticks past --ticks %d: the last request ran to its end, then %d ticks drained the held acks (4×(--max-ack-skew+4))",
		ticks, simrun.DrainTicks(maxAckSkew))
}

// simFailedOpsNote splits the failed ops into the injected ones (ok bits
// cleared at --fail-rate) and those the ranks' tiers failed.
func simFailedOpsNote(res simrun.Result, failRate float64) string {
	tiers := res.FailedOps - res.InjectedFailedOps
	if failRate == 0 {
		return fmt.Sprintf("(none injected: --fail-rate 0; %d failed by the tiers)", tiers)
	}
	return fmt.Sprintf("(%d injected at --fail-rate %g, %d failed by the tiers)", res.InjectedFailedOps, failRate, tiers)
}

// parseSimFaults parses "stall:2@100,crash:1@50".
func parseSimFaults(spec string, ranks int) ([]simgroup.Fault, error) {
	if spec == "" {
		return nil, nil
	}
	var out []simgroup.Fault
	for i, item := range strings.Split(spec, ",") {
		kind, rest, ok := strings.Cut(strings.TrimSpace(item), ":")
		rank, tick, ok2 := strings.Cut(rest, "@")
		if !ok || !ok2 {
			return nil, fmt.Errorf("item %d %q: want KIND:RANK@TICK", i+1, item)
		}
		var f simgroup.Fault
		switch kind {
		case "stall":
			f.Kind = simgroup.Stall
		case "crash":
			f.Kind = simgroup.Crash
		default:
			return nil, fmt.Errorf("item %d %q: kind %q, want stall or crash", i+1, item, kind)
		}
		r, err := strconv.Atoi(rank)
		if err != nil || r < 0 || r >= ranks {
			return nil, fmt.Errorf("item %d %q: rank %q, want 0..%d", i+1, item, rank, ranks-1)
		}
		t, err := strconv.ParseUint(tick, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("item %d %q: tick %q: %w", i+1, item, tick, err)
		}
		f.Rank, f.Tick = r, t
		out = append(out, f)
	}
	return out, nil
}

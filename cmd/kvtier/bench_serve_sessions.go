package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"

	"github.com/kvtier/kvtier/internal/benchreport"
)

// parseSessionCounts parses --cpu-sessions: at least two rank counts in
// 1..64, the first the base the others are compared with.
func parseSessionCounts(v []string) ([]int, error) {
	if len(v) < 2 {
		return nil, fmt.Errorf("--cpu-sessions %v: want at least two session counts (e.g. 1,8): %w", v, errUsage)
	}
	out := make([]int, len(v))
	for i, s := range v {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 64 {
			return nil, fmt.Errorf("--cpu-sessions: %q: want a session count in 1..64: %w", s, errUsage)
		}
		out[i] = n
	}
	return out, nil
}

// benchServeSessions runs serve subprocesses with each session count in
// counts (the ranks of one engine, stepping in lockstep), rounds times in
// turn, and reports serve's CPU per engine step (user+system over the
// run, over the steps every rank made) for each, and each count's ratio
// to the first: what one more local rank costs the control plane. A
// count above one runs twice a round: with one Machine for the node's
// ranks (serve's default) and with a Machine a rank (--machine-per-rank,
// the rows ending _machine_per_rank), so the change shows in one run.
func benchServeSessions(ctx context.Context, o serveRound, l3 string, counts []int, rounds int, stdout io.Writer, asJSON bool) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench serve: %w", err)
	}
	type run struct {
		n       int
		perRank bool
	}
	var runs []run
	for _, n := range counts {
		runs = append(runs, run{n, false})
		if n > 1 {
			runs = append(runs, run{n, true})
		}
	}
	per := make([][]float64, len(runs))
	steps := make([]int64, len(runs))
	// Each round also times serve's CPU per empty call (a Ping), the
	// largest count's sessions calling in lockstep as they step: the
	// least a rank's step can cost it.
	var call []float64
	top := slices.Max(counts)
	for r := range rounds {
		oo := o
		oo.sessions, oo.pings = top, pingsPerRound
		cpu, _, res, err := oo.runChild(ctx, exe, l3, nil)
		if err != nil {
			return fmt.Errorf("round %d (empty calls): %w", r+1, err)
		}
		call = append(call, cpu.Seconds()*1e6/float64(res.Steps))
		for i, rn := range runs {
			oo := o
			oo.sessions, oo.machinePerRank, oo.noPing = rn.n, rn.perRank, true
			cpu, _, res, err := oo.runChild(ctx, exe, l3, nil)
			if err != nil {
				return fmt.Errorf("round %d (--sessions %d, machine per rank %v): %w", r+1, rn.n, rn.perRank, err)
			}
			per[i] = append(per[i], cpu.Seconds()*1e6/float64(res.Steps))
			steps[i] = res.Steps
		}
	}
	what := copiesRun
	if !o.copies {
		what = copiesNotRun
	}
	base := median(per[0])
	var rows []benchreport.Result
	for i, rn := range runs {
		n := rn.n
		v := median(per[i])
		name, mode := fmt.Sprintf("serve/cpu_per_step_s%d", n), "one control Machine for the node's ranks"
		if rn.perRank {
			name, mode = name+"_machine_per_rank", "a control Machine a rank (--machine-per-rank)"
		}
		note := fmt.Sprintf("serve subprocess, %s, its CPU (user+system, /proc) over the run / engine steps (%d a round; each a Step of every session); rounds %v; L3 %s; %s; %s; %d new requests a step, %d requests; %s",
			mode, steps[i], roundUs(per[i]), l3, what, o.geometry(), o.perStep, o.requests, loadNote())
		row := benchreport.Result{Bench: name, Value: v, Unit: "us", Note: note}
		if i > 0 {
			row.Limit, row.LimitName, row.Target = base, fmt.Sprintf("serve CPU per step with %d sessions, same run", counts[0]), 1/1.5
			if v > 0 {
				row.Ratio = base / v
			}
		}
		rows = append(rows, row)
	}
	c := median(call)
	rows = append(rows, benchreport.Result{Bench: "serve/cpu_per_call", Value: c, Unit: "us",
		Note: fmt.Sprintf("serve subprocess with %d ranks, its CPU (user+system, /proc) over empty Ping calls / the calls: %d connections in lockstep (each one call, then the next round), %d rounds; rounds %v; %s",
			top, top, pingsPerRound, roundUs(call), loadNote())})
	for _, n := range counts[1:] {
		// NB: every rank's step is at least an empty call, so the first
		// count's step plus n-1 of them bounds the one-Machine step from
		// below whatever serve does with it.
		v := base + float64(n-counts[0])*c
		row := benchreport.Result{Bench: fmt.Sprintf("serve/cpu_floor_s%d", n), Value: v, Unit: "us",
			Limit: base, LimitName: fmt.Sprintf("serve CPU per step with %d sessions, same run", counts[0]), Target: 1 / 1.5,
			Note: fmt.Sprintf("the least serve CPU a step of %d sessions in lockstep can take when each session makes its own Step call: the %d-session step plus %d empty calls (serve/cpu_per_call); a ratio under the target: per-session calls alone exceed it on this machine", n, counts[0], n-counts[0])}
		if v > 0 {
			row.Ratio = base / v
		}
		rows = append(rows, row)
	}
	return benchreport.Write(stdout, rows, asJSON)
}

// pingsPerRound is how many lockstep rounds of empty calls a round of
// serve/cpu_per_call makes.
const pingsPerRound = 4000

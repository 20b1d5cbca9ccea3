package main

import (
	"errors"
	"fmt"
	"github.com/spf13/pflag"
	"runtime"
	"strings"

	"github.com/kvtier/kvtier/host/replay"
)

// Memory of a replay plan, per unique block of the trace. Every job's
// evictor lives until the plan ends and holds at most one entry per block
// in the tree (measured: about 14 bytes per unique block per job on the
// Mooncake synthetic trace, 40 capacities at the working set); each running
// replica holds a tree and a miss-fate byte per unique block (measured:
// about 33 bytes). Both are doubled and more for the collector.
const (
	replayJobBytesPerBlock     = 64
	replayReplicaBytesPerBlock = 256
)

// checkReplayFlags checks what replay's flags say on their own, before
// anything is loaded: a --capacity that was given is not empty,
// --sweep-points is at least 2 and a --parallel that was given at least 1.
func checkReplayFlags(fs *pflag.FlagSet, capacity string, points, parallel int) error {
	if fs.Changed("capacity") && strings.TrimSpace(capacity) == "" {
		return errors.New(`--capacity "": empty; give capacities in tokens such as 1M,3M,inf, or leave the flag out for the defaults`)
	}
	rs := []flagRange{{Flag: "sweep-points", Value: int64(points), Min: 2, MinWhy: "a sweep needs both ends", Max: int64(^uint(0) >> 1)}}
	if fs.Changed("parallel") {
		rs = append(rs, flagRange{Flag: "parallel", Value: int64(parallel), Min: 1, MinWhy: "leave the flag out for GOMAXPROCS", Max: int64(^uint(0) >> 1)})
	}
	return checkRanges(rs...)
}

// checkSweepPoints bounds --sweep-points by the trace, before the sweep's
// capacities are computed: between the working set / 256 and the working
// set there are at most as many distinct whole-block capacities as the
// trace has unique blocks.
func checkSweepPoints(tr *replay.Trace, points int) error {
	u := int64(max(tr.UniqueBlocks(), 2))
	return flagRange{Flag: "sweep-points", Value: int64(points), Min: 2, Max: u,
		MaxWhy: fmt.Sprintf("the trace has %d unique blocks, so a sweep has at most that many distinct capacities", tr.UniqueBlocks())}.check()
}

// checkReplayMemory checks that plan fits in the machine's memory: the
// flag that sets the number of capacities (sweep-points, or capacity for a
// list) and --parallel. capacities is the value to report for that flag
// (what was given, not what deduplication left).
func checkReplayMemory(m machine, tr *replay.Trace, plan replay.Plan, capacityFlag string, capacities int) error {
	shown := ""
	if capacityFlag == "capacity" {
		shown = fmt.Sprintf("--capacity with %d capacities", capacities)
	}
	u := int64(max(tr.UniqueBlocks(), 1))
	par := int64(plan.Parallel)
	if par <= 0 {
		par = int64(runtime.GOMAXPROCS(0))
	}
	// Per capacity: the policies and belady; once: the infinite row.
	replays := int64(len(plan.Policies) + 1)
	return m.checkMemoryShares(saturatingMul(u, replayJobBytesPerBlock),
		memoryShare{Flag: capacityFlag, Value: int64(capacities), Min: 1, Shown: shown,
			PerUnit:  saturatingMul(replays, saturatingMul(u, replayJobBytesPerBlock)),
			UnitName: fmt.Sprintf("capacity, %d replays of a %d-unique-block trace", replays, u)},
		memoryShare{Flag: "parallel", Value: par, Min: 1,
			PerUnit:  saturatingMul(u, replayReplicaBytesPerBlock),
			UnitName: fmt.Sprintf("replay running at once on a %d-unique-block trace", u)},
	)
}

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/kvtier/kvtier/bench/l3bench"
	"github.com/kvtier/kvtier/host/replay"
	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/kvtier/kvtier/internal/measure"
	"github.com/kvtier/kvtier/internal/memcopy"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/lru"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l1cuda"
	"github.com/kvtier/kvtier/tiers/tiertest"
	"github.com/kvtier/kvtier/workload"
	"github.com/spf13/cobra"
)

// Targets of kvtier bench host: the decision rate against the bare replay,
// the copies against memcpy and fio.
const (
	hostDecisionsTarget = 0.5  // of the bare replay, and at least 5M page events per CPU-second
	hostCopyTarget      = 0.8  // of memcpy
	hostSpillTarget     = 0.85 // of fio write (issue 27)
	hostReloadTarget    = 0.9  // of fio read (issue 27)
	// hostCopyWorkers is the host pool's default copy workers
	// (l1cuda.DefaultHostConfig).
	hostCopyWorkers = 2
)

// newBenchHostCmd returns `kvtier host`.
func newBenchHostCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "host [flags]",
		Short: "the Machine's decisions, copies, spill and reload against their limits",
		Long: `Measures the Machine's decisions in metadata mode against
the bare replay, and the data paths against their limits, each measured in
the same run.`,
		Example: `  kvtier bench host
  kvtier bench host --json`,
	}
	fs := cmd.Flags()
	asJSON := fs.Bool("json", false, "print one JSON object per line")
	tracePath := fs.String("trace", "", "Mooncake JSONL trace (default: "+defaultBenchTrace+" if present, else the generated workload)")
	rounds := countFlag(fs, "rounds", 3, "timed `rounds` per side (the median counts)")
	dir := fs.String("dir", os.TempDir(), "`directory` on the file system the spill and reload rows measure")
	l3Pages := countFlag(fs, "l3-pages", 64, "`number` of pages the spill and reload rows move")
	stepReqs := countFlag(fs, "step-requests", replay.DefaultStepRequests, "new `requests` per engine step of the host/decisions replay (the Machine ticks once a step)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		stdout := cmd.OutOrStdout()
		if fs.NArg() != 0 {
			return fmt.Errorf("bench host: unexpected arguments %v: %w", fs.Args(), errUsage)
		}
		if err := checkRanges(roundsRange("rounds", int64(*rounds)),
			flagRange{Flag: "l3-pages", Value: int64(*l3Pages), Min: 1, Max: 1 << 16},
			flagRange{Flag: "step-requests", Value: int64(*stepReqs), Min: 1, Max: 1 << 16}); err != nil {
			return fmt.Errorf("bench host: %w: %w", err, errUsage)
		}
		path := *tracePath
		if path == "" {
			if _, err := os.Stat(defaultBenchTrace); err == nil {
				path = defaultBenchTrace
			}
		}
		var tr *replay.Trace
		var err error
		if path != "" {
			reqs, err := workload.ReadFile(path)
			if err != nil {
				return fmt.Errorf("bench host: %w", err)
			}
			if tr, err = replay.Compile(filepath.Base(path), reqs); err != nil {
				return fmt.Errorf("bench host: %w", err)
			}
		} else {
			reqs, name, err := builtinWorkload()
			if err != nil {
				return fmt.Errorf("bench host: %w", err)
			}
			if tr, err = replay.Compile(name, reqs); err != nil {
				return fmt.Errorf("bench host: %w", err)
			}
		}
		var res []benchreport.Result
		r, err := benchHostDecisions(ctx, tr, *rounds, *stepReqs)
		if err != nil {
			return err
		}
		res = append(res, r...)
		cp, err := benchHostCopy(*rounds)
		if err != nil {
			return err
		}
		res = append(res, cp...)
		o := l3bench.DefaultOptions()
		o.Dir, o.Pages, o.Rounds = *dir, *l3Pages, *rounds
		o.Batch = min(o.Batch, o.Pages)
		// The Node hands every spill the CRC-32C the host pool's copy
		// took (issue 27): the store reads no page for its own.
		o.Sums = true
		l3, err := l3bench.Run(ctx, o)
		if err != nil {
			return fmt.Errorf("bench host: %w", err)
		}
		for _, x := range l3 {
			switch x.Bench {
			case "l3/spill":
				x.Bench, x.Target = "host/spill", hostSpillTarget
			case "l3/reload":
				x.Bench, x.Target = "host/reload", hostReloadTarget
			default:
				continue
			}
			x.Note = "the L3 store's Put/Get path the Node drives (l3bench), without the Node's bookkeeping; " + x.Note
			res = append(res, x)
		}
		return benchreport.Write(stdout, res, *asJSON)
	}
	return cmd
}

// benchHostDecisions times the Machine's decisions (MachineReplay: every
// op done at once) against the bare replay (HostReplay, lru) on the same
// trace, interleaved, in page events per CPU-second. The replay steps as an
// engine does: step new requests a step, one tick a step.
//
// The second row, host/decisions-tick-floor, times the replay's ticks alone
// (the same number, on a Machine with nothing in flight) and states them
// in the same unit, the page events of the replay: the Machine's ratio to
// the bare replay is at most floor/(floor+bare) even if every decision
// were free, since its match and insert walk the same tree the bare replay
// walks.
func benchHostDecisions(ctx context.Context, tr *replay.Trace, rounds, step int) ([]benchreport.Result, error) {
	o := replay.DecisionOptions()
	var mach, bare, floor []float64
	var hit float64
	var ticks uint64
	for range rounds {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var mr replay.MachineResult
		rate, err := cpuRate(func() (int64, error) {
			var err error
			mr, err = replay.MachineReplay(tr, o, replay.MachineConfig{StepRequests: step})
			return mr.PageEvents, err
		})
		if err != nil {
			return nil, fmt.Errorf("bench host: %w", err)
		}
		mach = append(mach, rate)
		hit, ticks = mr.HitRate(), mr.Ticks
		if rate, err = cpuRate(func() (int64, error) {
			ev, err := lru.New(policy.Options{})
			if err != nil {
				return 0, err
			}
			br, err := replay.HostReplay(tr, ev, 4000*workload.BlockTokens)
			return 2 * br.Blocks, err
		}); err != nil {
			return nil, fmt.Errorf("bench host: %w", err)
		}
		bare = append(bare, rate)
		if rate, err = cpuRate(func() (int64, error) {
			return mr.PageEvents, replay.IdleTicks(o, mr.Ticks)
		}); err != nil {
			return nil, fmt.Errorf("bench host: %w", err)
		}
		floor = append(floor, rate)
	}
	r := benchreport.Result{Bench: "host/decisions", Value: measure.Median(mach), Unit: "page-events/cpu-s", Target: hostDecisionsTarget,
		Note: fmt.Sprintf("%s: the Machine in metadata mode (L1 2000, L2 4000 pages, L3 on; every op done at once; a tick per engine step of %d new requests), page hit rate %.2f%%, %d ticks (%.2f per request); target also 5M page events per CPU-second; median of %d rounds interleaved with the bare replay", tr.Name, step, 100*hit, ticks, float64(ticks)/float64(max(tr.Requests(), 1)), rounds)}
	const bareName = "bare replay (host/replay HostReplay, lru, 4000 pages; match + insert pages per CPU-second)"
	fl := benchreport.Result{Bench: "host/decisions-tick-floor", Value: measure.Median(floor), Unit: "page-events/cpu-s",
		Note: fmt.Sprintf("the %d ticks of the host/decisions replay alone (contribution, reduce, tick, output; nothing in flight), as its page events per CPU-second of those ticks: the ticks cost what the bare replay costs when the ratio is 1; the Machine's ratio is at most floor/(floor+bare) however cheap its decisions", ticks)}
	return []benchreport.Result{r.WithLimit(bareName, measure.Median(bare)), fl.WithLimit(bareName, measure.Median(bare))}, nil
}

// cpuRate runs f until it has used at least minRateCPU of process CPU,
// and returns the units f reported per CPU-second. A collection runs
// first, outside the timer: process CPU counts the collector's threads,
// and the garbage of the side before would otherwise be billed to this
// one. Repeating amortizes the collections a side's own garbage causes
// (the bare replay takes about a millisecond, about what one collection of
// the trace's heap costs).
func cpuRate(f func() (int64, error)) (float64, error) {
	runtime.GC()
	return measure.Rate(measure.ProcessCPU, minRateCPU, f)
}

// minRateCPU is the least process CPU one cpuRate measurement takes.
const minRateCPU = 200 * time.Millisecond

// benchHostCopy times L1→L2 backups through the host pool (32 pages of
// 2.75 MiB, 64 layer slices) against one memcpy of the same bytes, and the
// load-back direction as an informative row.
func benchHostCopy(rounds int) ([]benchreport.Result, error) {
	const pages, layers = 32, 64
	payload := tiers.PayloadGeometry{PageTokens: 512, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: layers * 45056}}}
	size := payload.Kinds[0].PageBytes
	slab := tiertest.NewHeapSlab(2 * pages * size)
	p, err := l1cuda.OpenHost(tiers.Env{Logger: slog.New(slog.DiscardHandler), Payload: payload, WorldSize: 1, Slab: slab},
		l1cuda.HostConfig{Pages: pages, Layers: layers, Workers: hostCopyWorkers})
	if err != nil {
		return nil, fmt.Errorf("bench host: %w", err)
	}
	defer p.Close()
	batch := make([]tiers.PoolCopy, pages)
	for i := range batch {
		batch[i] = tiers.PoolCopy{Page: i, Kind: 0, Span: tiers.Span{Offset: int64(i) * size, Length: size}}
	}
	// Both sides hold real bytes: an untouched buffer reads from the
	// kernel's shared zero page and would flatter the memcpy.
	src := make([]byte, pages*size)
	for i := range src {
		src[i] = byte(i*7 + 3)
	}
	dst, err := slab.Bytes(tiers.Span{Offset: pages * size, Length: pages * size})
	if err != nil {
		return nil, err
	}
	first, err := slab.Bytes(tiers.Span{Offset: 0, Length: pages * size})
	if err != nil {
		return nil, err
	}
	copy(first, src)
	if _, err := timePoolBatch(p, true, batch); err != nil {
		return nil, err
	}
	if _, err := timePoolBatch(p, false, batch); err != nil {
		return nil, err
	}
	memcopy.Copy(dst, src)
	var to, from, mem []float64
	gbps := func(d time.Duration) float64 { return float64(pages*size) / d.Seconds() / 1e9 }
	for range max(rounds, 5) {
		d, err := timePoolBatch(p, true, batch)
		if err != nil {
			return nil, err
		}
		to = append(to, gbps(d))
		if d, err = timePoolBatch(p, false, batch); err != nil {
			return nil, err
		}
		from = append(from, gbps(d))
		s := time.Now()
		memcopy.Copy(dst, src)
		mem = append(mem, gbps(time.Since(s)))
	}
	note := fmt.Sprintf("host pool, %d pages of 2.75 MiB in %d layer slices, %d workers (the pool default), to page-contiguous slab spans (internal/memcopy gather); median of %d rounds interleaved with memcpy", pages, layers, hostCopyWorkers, len(to))
	limit := "memcopy.Copy of the same bytes, contiguous"
	a := benchreport.Result{Bench: "host/l1-to-l2", Value: measure.Median(to), Unit: "GB/s", Target: hostCopyTarget, Note: note}
	b := benchreport.Result{Bench: "host/l2-to-l1", Value: measure.Median(from), Unit: "GB/s", Note: note + "; informative, no target"}
	return []benchreport.Result{a.WithLimit(limit, measure.Median(mem)), b.WithLimit(limit, measure.Median(mem))}, nil
}

// timePoolBatch runs one copy batch and waits for every ack.
func timePoolBatch(p tiers.Pool, toSlab bool, batch []tiers.PoolCopy) (time.Duration, error) {
	start := time.Now()
	var id tiers.BatchID
	var err error
	if toSlab {
		id, err = p.CopyToSlab(context.Background(), batch)
	} else {
		id, err = p.CopyFromSlab(context.Background(), batch)
	}
	if err != nil {
		return 0, fmt.Errorf("bench host: %w", err)
	}
	for n := 0; n < len(batch); {
		for _, a := range p.DrainAcks(nil) {
			if a.Batch != id || a.Stage != tiers.AckCopied {
				return 0, fmt.Errorf("bench host: pool ack %+v", a)
			}
			n++
		}
		if n < len(batch) {
			<-p.AckReady()
		}
	}
	return time.Since(start), nil
}

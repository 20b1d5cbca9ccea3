package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/kvtier/kvtier/bench/l2bench"
	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/kvtier/kvtier/tiers/l2hugetlb/hugetest"
	"github.com/spf13/cobra"
)

// Memory of bench l2, measured with --min-time 10ms: about 245 bytes per
// live allocator object and 13 per digest page; each copy MiB is held four
// times (source, Go destination, anonymous mapping, slab), the gather area
// twice (the layer-first buffer and the slab).
const (
	l2BytesPerLiveObject = 512
	l2BytesPerDigestPage = 32
	l2BaseBytes          = 64 << 20
)

// checkBenchL2 checks --copy-mib, --live and --digest-pages against the
// machine's memory.
func checkBenchL2(m machine, o l2bench.Options, copyMiB int64) error {
	gather := 2 * int64(o.Layers) * o.SliceBytes * int64(o.GatherPages)
	return m.checkMemoryShares(l2BaseBytes+gather,
		memoryShare{Flag: "copy-mib", Value: copyMiB, Min: 1, PerUnit: 4 << 20, UnitName: "MiB, held four times"},
		memoryShare{Flag: "live", Value: int64(o.LiveObjects), Min: 1, PerUnit: l2BytesPerLiveObject, UnitName: "live object"},
		memoryShare{Flag: "digest-pages", Value: o.DigestPages, Min: 1, PerUnit: l2BytesPerDigestPage, UnitName: "digest page"},
	)
}

// newBenchL2Cmd returns `kvtier l2`.
func newBenchL2Cmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "l2 [flags]",
		Short: "L1 to L2 copies through the shm slab against memcpy",
		Long: `Measures the L2 hub (internal/bench/l2bench): page copies into a hugetlbfs
slab vs an anonymous mapping vs Go slices, per-layer gather/scatter vs one
copy, allocator reserve+release with 100k live objects, and the digest of
a 500k-page slab. As root it reserves hugepages and mounts hugetlbfs for
the run (and undoes both); where the kernel refuses, the slab goes to
/dev/shm and the results say so.`,
		Example: `  kvtier bench l2
  kvtier bench l2 --json`,
	}
	fs := cmd.Flags()
	o := l2bench.DefaultOptions()
	asJSON := fs.Bool("json", false, "print one JSON object per result instead of a table")
	fs.DurationVar(&o.MinTime, "min-time", o.MinTime, "minimum time per measurement")
	copyMiB := o.CopyBytes >> 20
	countVar(fs, &copyMiB, "copy-mib", "`size` of each copy destination in MiB")
	countVar(fs, &o.LiveObjects, "live", "live `objects` during the allocator measurement")
	countVar(fs, &o.DigestPages, "digest-pages", "slab `pages` of the digest measurement")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of the allocator workloads")
	noHuge := fs.Bool("no-hugetlbfs", false, "do not reserve hugepages; put the slab on /dev/shm")
	verbose := fs.Bool("v", false, "log progress to stderr")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		stdout := cmd.OutOrStdout()
		stderr := cmd.ErrOrStderr()
		if fs.NArg() > 0 {
			return fmt.Errorf("bench l2: unexpected arguments %q: %w", fs.Args(), errUsage)
		}
		if o.MinTime <= 0 {
			return fmt.Errorf("bench l2: --min-time must be positive: %w", errUsage)
		}
		if err := checkBenchL2(machineOf(ctx), o, copyMiB); err != nil {
			return fmt.Errorf("bench l2: %w: %w", err, errUsage)
		}
		o.CopyBytes = copyMiB << 20
		level := slog.LevelWarn
		if *verbose {
			level = slog.LevelInfo
		}
		o.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

		why := "-no-hugetlbfs given"
		if !*noHuge {
			m, err := hugetest.NewMount(os.TempDir(), o.HugePages())
			if err == nil {
				defer func() {
					if err := m.Close(); err != nil {
						o.Logger.Warn("bench l2: undo hugetlbfs setup", "err", err)
					}
				}()
				o.HugeDir = m.Dir
			} else {
				why = err.Error()
			}
		}
		if o.HugeDir == "" {
			fmt.Fprintf(stderr, "bench l2: slab on shm, not hugetlbfs: %s\n", why)
			dir, err := os.MkdirTemp("/dev/shm", "kvtier-bench-l2-")
			if err != nil {
				return fmt.Errorf("bench l2: shm directory: %w", err)
			}
			defer os.RemoveAll(dir)
			o.ShmDir = dir
		}
		start := time.Now()
		results, err := l2bench.Run(ctx, o)
		if err != nil {
			return err
		}
		o.Logger.Info("bench l2 done", "elapsed", time.Since(start))
		return benchreport.Write(stdout, results, *asJSON)
	}
	return cmd
}

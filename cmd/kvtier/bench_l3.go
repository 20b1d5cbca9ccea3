package main

import (
	"fmt"
	"log/slog"
	"math"

	"github.com/kvtier/kvtier/bench/indexbench"
	"github.com/kvtier/kvtier/bench/l3bench"
	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/tiers/l3disk"
	"github.com/spf13/cobra"
)

// What bench l3 holds, beyond its pages: memory for the store's 4 x depth
// aligned slot buffers, the slab of 2 x batch pages and a pattern page; disk
// for the store's slots (pages / gc_stop + batch, preallocated by writing),
// fio's file of pages slots and the indexes.
const (
	l3BaseBytes      = 64 << 20
	l3IndexDiskBytes = 512 << 20
)

// checkBenchL3 checks --page-bytes, --pages, --batch, --depth and
// --rounds: at least 1, and within the machine's memory and the free space
// of --dir.
func checkBenchL3(m machine, o l3bench.Options, indexBench bool) error {
	if err := checkRanges(
		flagRange{Flag: "page-bytes", Value: o.PageBytes, Min: 1, Max: math.MaxInt64},
		flagRange{Flag: "pages", Value: int64(o.Pages), Min: 1, Max: math.MaxInt64},
		flagRange{Flag: "batch", Value: int64(o.Batch), Min: 1, Max: math.MaxInt64},
		flagRange{Flag: "depth", Value: int64(o.Depth), Min: 1, Max: math.MaxInt64},
		roundsRange("rounds", int64(o.Rounds)),
	); err != nil {
		return err
	}
	// A page alone (one slab region, one buffer) must fit before the counts
	// are weighed in slots.
	if err := m.memoryRange("page-bytes", o.PageBytes, 1, 8, l3BaseBytes, "byte: a page is held at least 8 times").check(); err != nil {
		return err
	}
	slot := l3disk.SlotBytes(o.PageBytes)
	if err := m.checkMemoryShares(saturatingAdd(l3BaseBytes, 2*slot),
		memoryShare{Flag: "batch", Value: int64(o.Batch), Min: 1, PerUnit: saturatingMul(2, slot), UnitName: fmt.Sprintf("page of the batch (%s slots, two slab regions)", bytesString(slot))},
		memoryShare{Flag: "depth", Value: int64(o.Depth), Min: 1, PerUnit: saturatingMul(4, slot), UnitName: fmt.Sprintf("I/O in flight (four %s buffers)", bytesString(slot))},
	); err != nil {
		return err
	}
	free, err := m.FreeDisk(o.Dir)
	if err != nil {
		return fmt.Errorf("--dir %s: %w", o.Dir, err)
	}
	// Per page: its store slot (the store keeps pages / gc_stop slots) and
	// its slot in fio's file.
	gcStop := l3disk.DefaultConfig().GCStop
	perPage := int64(math.Ceil(float64(slot) * (1 + 1/gcStop)))
	fixed := saturatingMul(int64(o.Batch)+1, slot)
	if indexBench {
		fixed = saturatingAdd(fixed, l3IndexDiskBytes)
	}
	r := flagRange{Flag: "pages", Value: int64(o.Pages), Min: 1, Max: max(free-fixed, 0) / max(perPage, 1),
		MaxWhy: fmt.Sprintf("about %s of disk per page (a %s slot in the store at gc_stop %.2f, one in fio's file) plus %s for the batch and the indexes; %s free in %s",
			bytesString(perPage), bytesString(slot), gcStop, bytesString(fixed), bytesString(free), o.Dir)}
	return r.check()
}

// newBenchL3Cmd returns `kvtier l3`.
func newBenchL3Cmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "l3 [flags]",
		Short: "L3 disk spill and reload against fio",
		Long: `Measures the L3 disk store (spill and reload of full pages against fio on
the same file system) and its indexes (Index v1 against the raw
libraries).`,
		Example: `  kvtier bench l3
  kvtier bench l3 --json`,
	}
	fs := cmd.Flags()
	o := l3bench.DefaultOptions()
	var pageBytes string
	fs.StringVar(&o.Dir, "dir", o.Dir, "`directory` on the file system under test (a temporary directory is made inside and removed)")
	asJSON := fs.Bool("json", false, "print one JSON object per result instead of a table")
	fs.StringVar(&pageBytes, "page-bytes", "2.75MiB", "payload page `size`")
	countVar(fs, &o.Pages, "pages", "`pages` spilled and reloaded per round")
	countVar(fs, &o.Batch, "batch", "`pages` per Put or Get call")
	countVar(fs, &o.Depth, "depth", "`number` of reads and writes in flight (and fio's iodepth)")
	countVar(fs, &o.Rounds, "rounds", "`rounds` of store and fio, interleaved; the median of each side counts")
	fs.StringVar(&o.Index, "index", o.Index, "the store's index: lmdb or badger")
	fs.StringVar(&o.ODirect, "o-direct", o.ODirect, "the store's o_direct mode: auto, on or off")
	fs.StringVar(&o.ZeroCopy, "zero-copy", "auto", "the store's zero_copy mode: auto (on a slab in huge pages), on or off")
	fs.StringVar(&o.Fio, "fio", "", "fio `binary` (default: fio from PATH; - to skip the fio limits)")
	noIndex := fs.Bool("no-index-bench", false, "skip the Index v1 vs raw library benchmark")
	verbose := fs.Bool("v", false, "log the store's messages to stderr")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		stdout := cmd.OutOrStdout()
		stderr := cmd.ErrOrStderr()
		if fs.NArg() > 0 {
			return fmt.Errorf("bench l3: unexpected arguments %q: %w", fs.Args(), errUsage)
		}
		size, err := quantity.ParseSize(pageBytes)
		if err != nil {
			return fmt.Errorf("bench l3: --page-bytes: %w: %w", err, errUsage)
		}
		o.PageBytes = int64(size)
		if err := checkBenchL3(machineOf(ctx), o, !*noIndex); err != nil {
			return fmt.Errorf("bench l3: %w: %w", err, errUsage)
		}
		if *verbose {
			o.Logger = slog.New(slog.NewTextHandler(stderr, nil))
		}
		res, err := l3bench.Run(ctx, o)
		if err != nil {
			return err
		}
		if !*noIndex {
			io := indexbench.DefaultOptions()
			io.Dir = o.Dir
			ir, err := indexbench.Run(ctx, io)
			if err != nil {
				return fmt.Errorf("bench l3: index: %w", err)
			}
			res = append(res, ir...)
		}
		return benchreport.Write(stdout, res, *asJSON)
	}
	return cmd
}

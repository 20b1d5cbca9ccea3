package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/kvtier/kvtier/indexes/indexbench"
	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/tiers/l3disk/l3bench"
)

// runBenchL3 measures the L3 disk store (spill and reload of full pages
// against fio on the same file system) and its indexes (Index v1 against
// the raw libraries).
func runBenchL3(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := l3bench.DefaultOptions()
	fs := flag.NewFlagSet("kvtier bench l3", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var pageBytes string
	fs.StringVar(&o.Dir, "dir", o.Dir, "`directory` on the file system under test (a temporary directory is made inside and removed)")
	asJSON := fs.Bool("json", false, "print one JSON object per result instead of a table")
	fs.StringVar(&pageBytes, "page-bytes", "2.75MiB", "payload page `size`")
	fs.IntVar(&o.Pages, "pages", o.Pages, "pages spilled and reloaded per round")
	fs.IntVar(&o.Batch, "batch", o.Batch, "pages per Put or Get call")
	fs.IntVar(&o.Depth, "depth", o.Depth, "reads and writes in flight (and fio's iodepth)")
	fs.IntVar(&o.Rounds, "rounds", o.Rounds, "rounds of store and fio, interleaved; the median of each side counts")
	fs.StringVar(&o.Index, "index", o.Index, "the store's index: lmdb or badger")
	fs.StringVar(&o.ODirect, "o-direct", o.ODirect, "the store's o_direct mode: auto, on or off")
	fs.StringVar(&o.Fio, "fio", "", "fio `binary` (default: fio from PATH; - to skip the fio limits)")
	noIndex := fs.Bool("no-index-bench", false, "skip the Index v1 vs raw library benchmark")
	verbose := fs.Bool("v", false, "log the store's messages to stderr")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("bench l3: %w: %w", err, errUsage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench l3: unexpected arguments %q: %w", fs.Args(), errUsage)
	}
	size, err := quantity.ParseSize(pageBytes)
	if err != nil {
		return fmt.Errorf("bench l3: --page-bytes: %w: %w", err, errUsage)
	}
	o.PageBytes = int64(size)
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

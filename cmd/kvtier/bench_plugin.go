package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/kvtier/kvtier/bench/pluginbench"
	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/spf13/cobra"
)

// pluginBaseBytes is bench plugin's memory beyond its pages: this process
// and the plugin process.
const pluginBaseBytes = 128 << 20

// newBenchPluginCmd returns `kvtier plugin`.
func newBenchPluginCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "plugin [flags]",
		Short: "a plugin tier over go-plugin against the same tier in-process",
		Long: `Compares the memstore Store behind the example plugin binary with the same
store in process: put and get throughput of 2.75 MiB pages in 128-page
batches (ratio against in-process, target 0.9x) and per-call latency
p50/p99 for 1-page and 128-page batches.`,
		Example: `  kvtier bench plugin
  kvtier bench plugin --json`,
	}
	fs := cmd.Flags()
	asJSON := fs.Bool("json", false, "print one JSON object per line")
	plugin := fs.String("plugin", "", "memstore plugin binary (default: bin/plugins/kvtier-plugin-memstore, else built from the source tree)")
	slabDir := fs.String("slab-dir", "/dev/shm", "tmpfs for the slab files when /dev/hugepages is missing or full")
	batch := countFlag(fs, "batch", 128, "`pages` per large batch")
	rounds := countFlag(fs, "rounds", 10, "measured `rounds` of each large-batch figure (1-page figures run 10x as many)")
	verbose := fs.Bool("v", false, "log the plugin's lines to stderr")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		stdout := cmd.OutOrStdout()
		stderr := cmd.ErrOrStderr()
		if fs.NArg() != 0 {
			return fmt.Errorf("bench plugin: unexpected arguments %v: %w", fs.Args(), errUsage)
		}
		m := machineOf(ctx)
		if err := checkRanges(
			roundsRange("rounds", int64(*rounds)),
			m.memoryRange("batch", int64(*batch), 1, 3*pluginbench.PageBytes, pluginBaseBytes, fmt.Sprintf("page of the batch (%s, held three times: the slab and both stores)", bytesString(pluginbench.PageBytes))),
		); err != nil {
			return fmt.Errorf("bench plugin: %w: %w", err, errUsage)
		}
		path := *plugin
		if path == "" {
			tmp, err := os.MkdirTemp("", "kvtier-bench-plugin-")
			if err != nil {
				return fmt.Errorf("bench plugin: %w", err)
			}
			defer os.RemoveAll(tmp)
			if path, err = pluginbench.FindOrBuild(tmp); err != nil {
				return fmt.Errorf("bench plugin: %w", err)
			}
		}
		logger := slog.New(slog.DiscardHandler)
		if *verbose {
			logger = slog.New(slog.NewTextHandler(stderr, nil))
		}
		fmt.Fprintf(stderr, "bench plugin: %s, %d-page batches, %d rounds\n", path, *batch, *rounds)
		results, err := pluginbench.Run(ctx, pluginbench.Config{
			Plugin: path, SlabDir: *slabDir, BatchPages: *batch, Rounds: *rounds, Logger: logger,
		})
		if err != nil {
			return fmt.Errorf("bench plugin: %w", err)
		}
		return benchreport.Write(stdout, results, *asJSON)
	}
	return cmd
}

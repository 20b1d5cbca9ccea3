package main

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/kvtier/kvtier/tiers/redis"
	"github.com/kvtier/kvtier/tiers/redis/redisbench"
	"github.com/kvtier/kvtier/tiers/redis/redistest"
	"github.com/spf13/cobra"
)

// newBenchRedisCmd returns `kvtier redis`.
func newBenchRedisCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "redis [flags]",
		Short: "the Redis Store's put and get against raw pipelined go-redis",
		Long: `Compares the redis Store with a raw pipelined go-redis client on the same
server in the same run: put and get throughput of 2.75 MiB pages in
32-page batches (ratio store/raw, target 0.9x). Without --addr it starts
its own standalone redis-server on a loopback port.`,
		Example: `  kvtier bench redis
  kvtier bench redis --json`,
	}
	fs := cmd.Flags()
	asJSON := fs.Bool("json", false, "print one JSON object per line")
	addr := fs.String("addr", "", "comma-separated host:port of a server or cluster seeds (default: start a standalone redis-server)")
	mode := fs.String("mode", redis.ModeStandalone, "standalone or cluster (with --addr)")
	batch := fs.Int("batch", 32, "pages per Put or Get call")
	pageKiB := fs.Int("page-kib", 2816, "page payload size in KiB (2816 = 2.75 MiB)")
	depth := fs.Int("pipeline-depth", redis.DefaultConfig().PipelineDepth, "the store's pipeline_depth")
	rounds := fs.Int("rounds", 10, "measured rounds per side")
	seed := fs.Uint64("seed", 14, "seed of page contents and keys")
	verbose := fs.Bool("v", false, "log the store's lines to stderr")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		stdout := cmd.OutOrStdout()
		stderr := cmd.ErrOrStderr()
		if fs.NArg() != 0 {
			return fmt.Errorf("bench redis: unexpected arguments %v: %w", fs.Args(), errUsage)
		}
		// NB: checked before a redis-server starts; a batch or page past
		// these died in makeslice.
		if err := checkRanges(
			flagRange{Flag: "page-kib", Value: int64(*pageKiB), Min: 1, Max: maxRedisPageKiB,
				MaxWhy: "a fixed bound: 64 MiB, the largest page kvtier bench serve takes"},
			roundsRange("rounds", int64(*rounds)),
			machineOf(ctx).memoryRange("batch", int64(*batch), 1, redisCopiesPerPage*(int64(max(min(*pageKiB, maxRedisPageKiB), 0))<<10), 0,
				"page of the batch (a page is held five times: two slab copies, the raw client's read and redis-server's two keys)"),
		); err != nil {
			return fmt.Errorf("bench redis: %w: %w", err, errUsage)
		}
		cfg := redis.DefaultConfig()
		cfg.Mode = *mode
		cfg.PipelineDepth = *depth
		cfg.KeyPrefix = fmt.Sprintf("kvtier-bench:%d:", time.Now().UnixNano())
		cfg.Timeout = 30 * time.Second
		if *addr == "" {
			if *mode != redis.ModeStandalone {
				return fmt.Errorf("bench redis: --mode %s needs --addr: %w", *mode, errUsage)
			}
			srv, err := redistest.StartStandalone(ctx, redistest.Options{})
			if err != nil {
				return fmt.Errorf("bench redis: start a redis-server: %w", err)
			}
			defer srv.Stop()
			cfg.Addresses = []string{srv.Addr()}
			fmt.Fprintf(stderr, "bench redis: started redis-server on %s\n", srv.Addr())
		} else {
			cfg.Addresses = strings.Split(*addr, ",")
		}
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("bench redis: %w: %w", err, errUsage)
		}
		logger := slog.New(slog.DiscardHandler)
		if *verbose {
			logger = slog.New(slog.NewTextHandler(stderr, nil))
		}
		fmt.Fprintf(stderr, "bench redis: %s %v, %d-page batches of %d KiB, %d rounds\n", cfg.Mode, cfg.Addresses, *batch, *pageKiB, *rounds)
		results, err := redisbench.Run(ctx, redisbench.Config{
			Store: cfg, PageBytes: int64(*pageKiB) << 10, BatchPages: *batch, Rounds: *rounds, Seed: *seed, Logger: logger,
		})
		if err != nil {
			return fmt.Errorf("bench redis: %w", err)
		}
		return benchreport.Write(stdout, results, *asJSON)
	}
	return cmd
}

const (
	// maxRedisPageKiB bounds bench redis's --page-kib.
	maxRedisPageKiB = 64 << 10
	// redisCopiesPerPage is how many times bench redis holds each page of
	// a batch in this machine's memory.
	redisCopiesPerPage = 5
)

package main

import "github.com/spf13/cobra"

// newBenchCmd returns `kvtier bench`, the family of benchmarks; each member
// lives in its own file (bench_NAME.go) and declares its own flags.
func newBenchCmd() *cobra.Command {
	c := groupCommand("bench", "run a benchmark on this machine (radix, l2, l3, planner, plugin, ...)",
		newBenchRadixCmd(), newBenchL2Cmd(), newBenchL3Cmd(), newBenchGroupCmd(), newBenchPlannerCmd(),
		newBenchPluginCmd(), newBenchRedisCmd(), newBenchHostCmd(), newBenchServeCmd(), newBenchStoreCmd())
	c.Long = `Measures on this machine, each figure beside the limit measured in the
same run (naive LRU, memcpy, fio, the raw index library, the in-process
tier, a raw TCP all-gather) and their ratio.`
	c.Example = `  kvtier bench radix --json
  kvtier bench serve --rounds 3 --l3 l3disk
  kvtier bench store --page-bytes 2816KiB --batch 128`
	return c
}

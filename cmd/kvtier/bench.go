package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
)

// benchCommand is one member of the `kvtier bench` family; each lives in its
// own file (bench_NAME.go) and parses its own flags.
type benchCommand func(ctx context.Context, args []string, stdout, stderr io.Writer) error

func benches() map[string]benchCommand {
	return map[string]benchCommand{
		"radix":   runBenchRadix,
		"l2":      runBenchL2,
		"l3":      runBenchL3,
		"group":   runBenchGroup,
		"planner": runBenchPlanner,
		"plugin":  runBenchPlugin,
		"redis":   runBenchRedis,
		"host":    runBenchHost,
		"serve":   runBenchServe,
		"store":   runBenchStore,
	}
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	all := benches()
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return fmt.Errorf("bench: name one of %s: %w", strings.Join(names, ", "), errUsage)
	}
	b, ok := all[args[0]]
	if !ok {
		return fmt.Errorf("bench %q: unknown (known: %s): %w", args[0], strings.Join(names, ", "), errUsage)
	}
	return b(ctx, args[1:], stdout, stderr)
}

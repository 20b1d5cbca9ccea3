// Command kvtier is the command line of the kvtier KV-cache tier framework:
// replay traces through the radix tree and its eviction policies, validate
// stack configs, run benchmarks, and inspect tiers.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands lists the subcommands; each lives in its own file.
func commands() map[string]command {
	return map[string]command{
		"version":  {"print the module version and VCS revision", runVersion},
		"config":   {"validate a stack config or print the embedded default", runConfig},
		"replay":   {"replay a trace through the radix tree and eviction policies", runReplay},
		"generate": {"write a generated workload (profile, seed) as a Mooncake JSONL trace", runGenerate},
		"bench":    {"run a benchmark on this machine (radix, l2, l3, planner, plugin)", runBench},
		"inspect":  {"check a tier's on-disk state offline (l3)", runInspect},
		"plugin":   {"pin (sum) or smoke-test (check) a tier or index plugin binary", runPlugin},
		"doctor":   {"check this machine against a stack config before serving", runDoctor},
		"serve":    {"serve the engine API: the ranks of a stack over a unix socket", runServe},
		"loadgen":  {"drive a running kvtier serve with a trace: N rank sessions, every loaded byte verified", runLoadgen},
		"sim":      {"simulate a rank group (delays, faults, divergence) and check it never diverges or hangs", runSim},
		"ab":       {"compare serve's shadow policies with the live one on live traffic (hit rates, confidence intervals, a verdict)", runAB},
	}
}

// errUsage marks a command-line mistake: exit status 2.
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "kvtier:", err)
		}
		if errors.Is(err, errUsage) || errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmds := commands()
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stderr, cmds)
		if len(args) == 0 {
			return fmt.Errorf("no command given: %w", errUsage)
		}
		return nil
	}
	c, ok := cmds[args[0]]
	if !ok {
		usage(stderr, cmds)
		return fmt.Errorf("unknown command %q: %w", args[0], errUsage)
	}
	return c.run(ctx, args[1:], stdout, stderr)
}

func usage(w io.Writer, cmds map[string]command) {
	fmt.Fprintln(w, "usage: kvtier COMMAND [flags]\n\ncommands:")
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, cmds[n].summary)
	}
}

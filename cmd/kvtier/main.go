// Command kvtier is the command line of the kvtier KV-cache tier framework:
// replay traces through the radix tree and its eviction policies, validate
// stack configs, run benchmarks, and inspect tiers.
//
// The commands are spf13/cobra commands over spf13/pflag flag sets: flags go
// before or after the positional arguments, "--" ends them, every command
// has --help in the same layout with examples, `kvtier completion
// bash|zsh|fish` writes a shell completion script, and an unknown command or
// flag is answered with the nearest name. Each command's constructor
// (newServeCmd, ...) declares its flags beside the function that runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kvtier/kvtier/host/doctor"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

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

// run runs the command line args (without the program name). A mistake in
// the command line (an unknown command or flag, a bad flag value, missing
// or extra arguments) returns an error wrapping errUsage; a command's
// --help prints its help on stdout and returns flag.ErrHelp (the standard
// library's, so callers need not know about pflag); `kvtier`, `kvtier
// --help` and `kvtier help [COMMAND]` print help and return nil, except
// that a bare `kvtier` is a usage error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return execute(ctx, newRootCmd(), args, stdout, stderr)
}

// execute runs args with the command tree root as run does.
func execute(ctx context.Context, root *cobra.Command, args []string, stdout, stderr io.Writer) error {
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	// Errors returned before a command's RunE starts are the command
	// line's: unknown commands, flag errors, argument counts.
	started := false
	var wrap func(c *cobra.Command)
	wrap = func(c *cobra.Command) {
		if f := c.RunE; f != nil {
			c.RunE = func(cmd *cobra.Command, args []string) error {
				started = true
				return f(cmd, args)
			}
		}
		for _, sub := range c.Commands() {
			wrap(sub)
		}
	}
	wrap(root)
	if err := checkSubcommand(root, args); err != nil {
		return err
	}
	c, err := root.ExecuteContextC(ctx)
	if err != nil {
		if started || errors.Is(err, errUsage) {
			return err
		}
		// NB: cobra's suggestion for an unknown command is a paragraph
		// ("\n\nDid you mean this?\n\tNAME\n"); the error is one line.
		msg, sugg, ok := strings.Cut(err.Error(), "\n\nDid you mean this?\n")
		if ok {
			msg += "; did you mean " + strings.Join(strings.Fields(sugg), " or ") + "?"
		}
		return fmt.Errorf("%s (%s --help lists the commands and flags): %w", msg, c.CommandPath(), errUsage)
	}
	if h := c.Flags().Lookup("help"); h != nil && h.Changed && c != root {
		return flag.ErrHelp
	}
	return nil
}

// newRootCmd returns the kvtier command with every subcommand.
func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "kvtier",
		Short: "the kvtier KV-cache tier framework",
		Long: `kvtier replays traces through the radix tree and its eviction policies,
validates stack configs, serves the engine API over a stack of tiers,
runs benchmarks and inspects tiers.`,
		Example: `  kvtier generate --profile docs --seed 1 -o docs.jsonl
  kvtier replay docs.jsonl --policy lru --vs s3fifo --sweep
  kvtier config default --serve > stack.yaml
  kvtier serve --config stack.yaml --socket /tmp/kvtier.sock
  kvtier completion bash > /etc/bash_completion.d/kvtier`,
		SilenceErrors:              true,
		SilenceUsage:               true,
		SuggestionsMinimumDistance: 2,
		Args:                       nil, // cobra checks the command name, with suggestions
		RunE: func(cmd *cobra.Command, args []string) error {
			cmd.SetOut(cmd.ErrOrStderr())
			_ = cmd.Usage()
			return fmt.Errorf("no command given: %w", errUsage)
		},
	}
	root.SetFlagErrorFunc(flagError)
	root.AddCommand(
		newVersionCmd(),
		newConfigCmd(),
		newReplayCmd(),
		newGenerateCmd(),
		newBenchCmd(),
		newInspectCmd(),
		newPluginCmd(),
		newDoctorCmd(doctor.OS{}),
		newServeCmd(),
		newLoadgenCmd(),
		newSimCmd(),
		newABCmd(),
	)
	return root
}

// groupCommand returns a command that only holds subcommands: run alone,
// it names them.
func groupCommand(name, short string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{
		Use:   name + " COMMAND",
		Short: short,
	}
	c.AddCommand(subs...)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		cmd.SetOut(cmd.ErrOrStderr())
		_ = cmd.Usage()
		return fmt.Errorf("%s: name a command: one of %s: %w", name, strings.Join(subcommandNames(cmd), ", "), errUsage)
	}
	return c
}

// noArgs refuses positional arguments.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("%s takes no arguments, got %q", cmd.CommandPath(), args)
	}
	return nil
}

// subcommandNames returns the names of c's subcommands, sorted.
func subcommandNames(c *cobra.Command) []string {
	var names []string
	for _, s := range c.Commands() {
		if s.IsAvailableCommand() {
			names = append(names, s.Name())
		}
	}
	return names
}

// checkSubcommand refuses an unknown subcommand of a group below the root
// (`kvtier bench radx`), with the nearest names; cobra checks only the
// root's, and would otherwise answer `kvtier bench radx --help` with
// bench's help.
func checkSubcommand(root *cobra.Command, args []string) error {
	c, rest, err := root.Find(args)
	if err != nil || c == root || !c.HasSubCommands() {
		return nil
	}
	for _, a := range rest {
		if a == "--" {
			return nil
		}
		if strings.HasPrefix(a, "-") {
			continue
		}
		msg := fmt.Sprintf("unknown command %q for %q (known: %s)", a, c.CommandPath(), strings.Join(subcommandNames(c), ", "))
		c.SuggestionsMinimumDistance = root.SuggestionsMinimumDistance
		if s := c.SuggestionsFor(a); len(s) > 0 {
			msg += fmt.Sprintf("; did you mean %s?", strings.Join(s, " or "))
		}
		return fmt.Errorf("%s: %w", msg, errUsage)
	}
	return nil
}

// flagError is every command's answer to a flag it cannot parse: the
// error, the nearest flag name for an unknown one, marked errUsage.
func flagError(c *cobra.Command, err error) error {
	return fmt.Errorf("%s: %w%s: %w", c.CommandPath(), err, suggestFlag(c.Flags(), err), errUsage)
}

// suggestFlag returns " (did you mean --NAME?)" for an unknown-flag error
// whose name is near a flag of fs, else "". pflag reads "-socket" as the
// shorthands s, o, c, ...: a long flag written with one dash is named too.
func suggestFlag(fs *pflag.FlagSet, err error) string {
	msg := err.Error()
	var typed string
	if name, ok := strings.CutPrefix(msg, "unknown flag: --"); ok {
		typed = name
	} else if i := strings.LastIndex(msg, " in -"); strings.HasPrefix(msg, "unknown shorthand flag: ") && i >= 0 {
		typed = msg[i+len(" in -"):]
		if f := fs.Lookup(strings.SplitN(typed, "=", 2)[0]); f != nil {
			return fmt.Sprintf(" (did you mean --%s? long flags take two dashes)", f.Name)
		}
	}
	typed, _, _ = strings.Cut(typed, "=")
	if typed == "" {
		return ""
	}
	best, bestDist := "", 3 // a suggestion at most 2 edits away
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		d := editDistance(strings.ToLower(typed), strings.ToLower(f.Name))
		if strings.HasPrefix(f.Name, typed) && len(typed) >= 3 {
			d = min(d, 1)
		}
		if d < bestDist || (d == bestDist && f.Name < best) {
			best, bestDist = f.Name, d
		}
	})
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean --%s?)", best)
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kvtier/kvtier/workload"
	"github.com/spf13/cobra"
)

// newGenerateCmd returns `kvtier generate`.
func newGenerateCmd() *cobra.Command {
	var b strings.Builder
	for _, p := range workload.Profiles() {
		fmt.Fprintf(&b, "  %-8s %s\n", p.Name, p.Doc)
	}
	cmd := &cobra.Command{
		Use:   "generate [flags]",
		Short: "write a generated workload (profile, seed) as a Mooncake JSONL trace",
		Long: `Writes a generated workload as a Mooncake-format JSONL trace, for
kvtier replay (e.g. kvtier replay FILE --sweep). A profile fixes the
generator config; the seed makes it reproducible.

Profiles:
` + strings.TrimRight(b.String(), "\n"),
		Example: `  kvtier generate --profile docs --seed 7 -o docs.jsonl
  kvtier generate --profile agents --requests 2000 > agents.jsonl`,
		Args: noArgs,
	}
	fs := cmd.Flags()
	profile := fs.String("profile", "default", "generator profile")
	seed := fs.Uint64("seed", 1, "generator seed")
	requests := fs.Int("requests", 0, "number of requests (default: the profile's)")
	out := fs.StringP("output", "o", "-", "output file, - for stdout")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		return runGenerate(cmd.Context(), *profile, *seed, *requests, *out, cmd.OutOrStdout())
	}
	return cmd
}

// runGenerate writes the workload of profile and seed (requests of them if
// positive) to out, "-" for stdout.
func runGenerate(ctx context.Context, profile string, seed uint64, requests int, out string, stdout io.Writer) error {
	p, err := workload.ProfileByName(profile)
	if err != nil {
		return fmt.Errorf("generate: %w: %w", err, errUsage)
	}
	cfg := p.Config(seed)
	if requests > 0 {
		cfg.Requests = requests
	}
	reqs, err := workload.Generate(cfg)
	if err != nil {
		return fmt.Errorf("generate: %w", err)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if out == "-" {
		return workload.Write(stdout, reqs)
	}
	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("generate: %w", err)
	}
	if err := workload.Write(f, reqs); err != nil {
		f.Close()
		return fmt.Errorf("generate %s: %w", out, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("generate %s: %w", out, err)
	}
	return nil
}

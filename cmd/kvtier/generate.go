package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kvtier/kvtier/workload"
)

const generateUsage = `usage: kvtier generate [flags]

Writes a generated workload as a Mooncake-format JSONL trace, for
kvtier replay (e.g. kvtier replay FILE --sweep). A profile fixes the
generator config; the seed makes it reproducible.

profiles:
%s
flags:
`

func runGenerate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		var b strings.Builder
		for _, p := range workload.Profiles() {
			fmt.Fprintf(&b, "  %-8s %s\n", p.Name, p.Doc)
		}
		fmt.Fprintf(stderr, generateUsage, b.String())
		fs.PrintDefaults()
	}
	profile := fs.String("profile", "default", "generator profile")
	seed := fs.Uint64("seed", 1, "generator seed")
	requests := fs.Int("requests", 0, "number of requests (default: the profile's)")
	out := fs.String("o", "-", "output file, - for stdout")
	if err := parseInterspersed(fs, args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return fmt.Errorf("generate: %w: %w", err, errUsage)
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("generate: unexpected arguments %v: %w", fs.Args(), errUsage)
	}
	p, err := workload.ProfileByName(*profile)
	if err != nil {
		return fmt.Errorf("generate: %w: %w", err, errUsage)
	}
	cfg := p.Config(*seed)
	if *requests > 0 {
		cfg.Requests = *requests
	}
	reqs, err := workload.Generate(cfg)
	if err != nil {
		return fmt.Errorf("generate: %w", err)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if *out == "-" {
		return workload.Write(stdout, reqs)
	}
	f, err := os.Create(*out)
	if err != nil {
		return fmt.Errorf("generate: %w", err)
	}
	if err := workload.Write(f, reqs); err != nil {
		f.Close()
		return fmt.Errorf("generate %s: %w", *out, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("generate %s: %w", *out, err)
	}
	return nil
}

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/host/serve"
	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/tiers"
)

const configUsage = `usage: kvtier config COMMAND

commands:
  validate FILE   check a stack config; prints "ok: N tiers, policy P" or the error
  show [FILE]     print a stack config with every default filled in (no FILE: the default stack)
  default         print the embedded default stack config (replay, doctor and
                  config show use it without --config)
  default --serve print the embedded demo stack kvtier serve runs without
                  --config ({{DIR}} = --data-dir, {{RANK}} = the rank)
  modules         list the registered tier, index, policy and planner modules
`

// runConfig implements `kvtier config`.
func runConfig(_ context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, configUsage)
		return fmt.Errorf("config: name a command (validate, show, default, modules): %w", errUsage)
	}
	sub, rest := args[0], args[1:]
	fs := flag.NewFlagSet("config "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, configUsage) }
	var serveStack *bool
	if sub == "default" {
		serveStack = fs.Bool("serve", false, "print the embedded stack of kvtier serve instead")
	}
	if err := parseInterspersed(fs, rest); err != nil {
		return err
	}
	switch sub {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, configUsage)
		return nil
	case "validate":
		if fs.NArg() != 1 {
			return fmt.Errorf("config validate: want one FILE, got %d arguments: %w", fs.NArg(), errUsage)
		}
		s, err := configLoadStack(fs.Arg(0))
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "ok: %d tiers, policy %s\n", len(s.Tiers), s.Policy.Evictor)
		return nil
	case "show":
		if fs.NArg() > 1 {
			return fmt.Errorf("config show: want at most one FILE, got %d arguments: %w", fs.NArg(), errUsage)
		}
		s, err := configLoadStack(fs.Arg(0))
		if err != nil {
			return err
		}
		b, err := s.MarshalYAML()
		if err != nil {
			return fmt.Errorf("config show: %w", err)
		}
		_, err = stdout.Write(b)
		return err
	case "default":
		if fs.NArg() != 0 {
			return fmt.Errorf("config default takes no arguments: %w", errUsage)
		}
		if *serveStack {
			_, err := io.WriteString(stdout, serve.DefaultYAML())
			return err
		}
		_, err := stdout.Write(config.DefaultYAML())
		return err
	case "modules":
		if fs.NArg() != 0 {
			return fmt.Errorf("config modules takes no arguments: %w", errUsage)
		}
		return configListModules(stdout)
	}
	fmt.Fprint(stderr, configUsage)
	return fmt.Errorf("config: unknown command %q (known: validate, show, default, modules): %w", sub, errUsage)
}

// configModules returns the registries of the modules built into this
// binary.
func configModules() (config.Modules, error) {
	tr, err := builtin.Tiers()
	if err != nil {
		return config.Modules{}, err
	}
	ir, err := builtin.Indexes()
	if err != nil {
		return config.Modules{}, err
	}
	pr, err := builtin.Policies()
	if err != nil {
		return config.Modules{}, err
	}
	return config.Modules{Tiers: tr, Indexes: ir, Policies: pr}, nil
}

// configLoadStack loads the stack config at path, or the embedded default when
// path is empty, with the built-in modules.
func configLoadStack(path string) (*config.Stack, error) {
	m, err := configModules()
	if err != nil {
		return nil, err
	}
	if path == "" {
		return config.Default(m)
	}
	return config.LoadFile(path, m)
}

func configListModules(w io.Writer) error {
	m, err := configModules()
	if err != nil {
		return err
	}
	// NB: planners are not in config.Modules: a stack selects one by
	// $.policy.planner, checked against a fixed list, not decoded from a
	// module's config block. They are registered modules all the same.
	planners, err := builtin.Planners()
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ROLE\tNAME\tTYPE\tCONFIG\tDESCRIPTION")
	row := func(role, name, typ string, hasConfig bool, doc string) {
		cfg := "-"
		if hasConfig {
			cfg = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", role, name, typ, cfg, doc)
	}
	for _, r := range m.Tiers.Pools.All() {
		row("pool", r.Name, string(r.Type), r.NewConfig != nil, r.Doc)
	}
	for _, r := range m.Tiers.Slabs.All() {
		row("slab", r.Name, string(r.Type), r.NewConfig != nil, r.Doc)
	}
	for _, r := range m.Tiers.Stores.All() {
		row("store", r.Name, string(r.Type), r.NewConfig != nil, r.Doc)
	}
	for _, r := range m.Indexes.All() {
		row("index", r.Name, string(r.Type), r.NewConfig != nil, r.Doc)
	}
	for _, r := range m.Policies.All() {
		row("policy", r.Name, string(r.Type), r.NewConfig != nil, r.Doc)
	}
	for _, r := range planners.All() {
		row("planner", r.Name, string(r.Type), r.NewConfig != nil, r.Doc)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// Keep the role IDs in the output honest if a registry is empty.
	var empty []string
	for role, n := range map[string]int{
		string(tiers.PoolV1): len(m.Tiers.Pools.All()), string(tiers.SlabV1): len(m.Tiers.Slabs.All()),
		string(tiers.StoreV1): len(m.Tiers.Stores.All()), string(indexes.IndexV1): len(m.Indexes.All()),
		string(policy.PlannerV1): len(planners.All()),
	} {
		if n == 0 {
			empty = append(empty, role)
		}
	}
	if len(empty) > 0 {
		sort.Strings(empty)
		fmt.Fprintf(w, "\nno module registered for: %s\n", strings.Join(empty, ", "))
	}
	return nil
}

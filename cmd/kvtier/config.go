package main

import (
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/host/serve"
	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/tiers"
	"github.com/spf13/cobra"
)

// newConfigCmd returns `kvtier config validate|show|default|modules`.
func newConfigCmd() *cobra.Command {
	c := groupCommand("config", "validate a stack config or print the embedded default",
		newConfigValidateCmd(), newConfigShowCmd(), newConfigDefaultCmd(), newConfigModulesCmd())
	c.Example = `  kvtier config default > stack.yaml
  kvtier config validate stack.yaml
  kvtier config show stack.yaml
  kvtier config default --serve
  kvtier config modules`
	return c
}

// newConfigValidateCmd returns `kvtier config validate FILE`.
func newConfigValidateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "validate FILE",
		Short: `check a stack config; prints "ok: N tiers, policy P" or the error`,
		Long: `Checks a stack config with the modules built into this binary; an error names the YAML path and line.
A config for kvtier serve (one with its placeholders: {{DIR}}, {{RANK}}, {{RANKS}},
{{DIRHASH}}) is checked as serve reads it, for every rank of its world size.`,
		Example: "  kvtier config validate stack.yaml",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("config validate: want one FILE, got %d arguments", len(args))
			}
			return nil
		},
	}
	dataDir := cmd.Flags().String("data-dir", "", "with serve's placeholders in FILE: the `dir` {{DIR}} stands for (default: serve's default --data-dir)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		s, expanded, err := configLoadStack(args[0], serveView{dataDir: *dataDir})
		if err != nil {
			return err
		}
		if expanded != "" {
			expanded = " (" + expanded + ")"
		}
		fmt.Fprintf(cmd.OutOrStdout(), "ok: %d tiers, policy %s%s\n", len(s.Tiers), s.Policy.Evictor, expanded)
		return nil
	}
	return cmd
}

// newConfigShowCmd returns `kvtier config show [FILE]`.
func newConfigShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "show [FILE]",
		Short:   "print a stack config with every default filled in (no FILE: the default stack)",
		Example: "  kvtier config show\n  kvtier config show stack.yaml",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 1 {
				return fmt.Errorf("config show: want at most one FILE, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			path := ""
			if len(args) == 1 {
				path = args[0]
			}
			s, _, err := configLoadStack(path, serveView{})
			if err != nil {
				return err
			}
			b, err := s.MarshalYAML()
			if err != nil {
				return fmt.Errorf("config show: %w", err)
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		},
	}
}

// newConfigDefaultCmd returns `kvtier config default [--serve]`.
func newConfigDefaultCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "default [--serve]",
		Short: "print the embedded default stack config (replay, doctor and config show use it without --config)",
		Long: `Prints the embedded default stack config, which kvtier replay, kvtier
doctor and kvtier config show use without --config; with --serve, the
embedded demo stack kvtier serve runs without --config ({{DIR}} =
--data-dir, {{RANK}} = the rank).`,
		Example: "  kvtier config default > stack.yaml\n  kvtier config default --serve > serve.yaml",
		Args:    noArgs,
	}
	serveStack := cmd.Flags().Bool("serve", false, "print the embedded stack of kvtier serve instead")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if *serveStack {
			_, err := io.WriteString(cmd.OutOrStdout(), serve.DefaultYAML())
			return err
		}
		_, err := cmd.OutOrStdout().Write(config.DefaultYAML())
		return err
	}
	return cmd
}

// newConfigModulesCmd returns `kvtier config modules`.
func newConfigModulesCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "modules",
		Short:   "list the registered tier, index, policy and planner modules",
		Example: "  kvtier config modules",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return configListModules(cmd.OutOrStdout())
		},
	}
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
// path is empty, with the built-in modules. A config with serve's
// placeholders ({{DIR}}, {{RANK}}, {{RANKS}}, {{DIRHASH}}: a config for
// kvtier serve) is read as serve reads it (serveView): expanded for every
// rank of its world size, each checked, and the view's rank returned;
// expanded says so.
func configLoadStack(path string, v serveView) (st *config.Stack, expanded string, err error) {
	m, err := configModules()
	if err != nil {
		return nil, "", err
	}
	return loadStackAs(path, m, v)
}

// loadStackAs is configLoadStack with the modules m.
func loadStackAs(path string, m config.Modules, v serveView) (st *config.Stack, expanded string, err error) {
	if path == "" {
		st, err := config.Default(m)
		return st, "", err
	}
	data, err := config.ReadFile(path)
	if err != nil {
		return nil, "", err
	}
	if !bytes.Contains(data, []byte("{{")) {
		st, err := config.Load(data, path, m)
		return st, "", err
	}
	dir, err := serveDataDir(v.dataDir)
	if err != nil {
		return nil, "", fmt.Errorf("%s has serve's placeholders: %w", path, err)
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, "", fmt.Errorf("data dir: %w", err)
	}
	// The world size is the config's own, read from rank 0's view.
	st0, err := config.Load([]byte(serve.Expand(string(data), dir, 0, 1)), path, m)
	if err != nil {
		return nil, "", err
	}
	ranks := max(1, st0.Ranks.WorldSize)
	if v.rank < 0 || v.rank >= ranks {
		return nil, "", fmt.Errorf("--rank %d: %s is a stack for ranks 0..%d: %w", v.rank, path, ranks-1, errUsage)
	}
	for r := range ranks {
		s, err := config.Load([]byte(serve.Expand(string(data), dir, r, ranks)), path, m)
		if err != nil {
			return nil, "", fmt.Errorf("rank %d of %d: %w", r, ranks, err)
		}
		if r == v.rank {
			st = s
		}
	}
	return st, fmt.Sprintf("serve's placeholders expanded for ranks 0..%d, data dir %s", ranks-1, dir), nil
}

// serveView is how a command reads a config written for kvtier serve: the
// data dir its {{DIR}} stands for (empty: serve's default) and the rank
// whose view it takes.
type serveView struct {
	dataDir string
	rank    int
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

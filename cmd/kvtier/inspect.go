package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/badger"
	"github.com/kvtier/kvtier/indexes/lmdb"
	"github.com/kvtier/kvtier/tiers/l3disk"
	"github.com/spf13/cobra"
)

// errDamage marks an inspection that found damage: exit status 1 with the
// counts already printed.
var errDamage = errors.New("damage found")

// newInspectCmd returns `kvtier inspect`, the offline checks of a tier's
// on-disk state.
func newInspectCmd() *cobra.Command {
	c := groupCommand("inspect", "check a tier's on-disk state offline (l3)", newInspectL3Cmd(builtinModules))
	c.Example = "  kvtier inspect l3 --config stack.yaml"
	return c
}

// dirList is a repeatable, comma-separable --dir flag.
type dirList []string

func (d *dirList) String() string { return strings.Join(*d, ",") }

// Type names the value in --help.
func (d *dirList) Type() string { return "dirs" }

func (d *dirList) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*d = append(*d, p)
		}
	}
	return nil
}

// builtinModules returns the registries of the modules built into this
// binary, as inspect l3 opens a stack with them.
func builtinModules() (config.Modules, error) {
	var m config.Modules
	var err error
	if m.Tiers, err = builtin.Tiers(); err != nil {
		return m, err
	}
	if m.Indexes, err = builtin.Indexes(); err != nil {
		return m, err
	}
	if m.Policies, err = builtin.Policies(); err != nil {
		return m, err
	}
	return m, nil
}

// maxInspectDepth bounds inspect's reads in flight: past the deepest
// device queues (NVMe's 1023 per queue) more reads in flight only wait in
// the kernel. Each read holds one whole-slot buffer; with --config the
// slot size is known and depth is also checked against memory.
const (
	maxInspectDepth = 1024
	inspectDepthWhy = "a fixed bound: past the deepest device queues more reads in flight only wait in the kernel"
)

// inspectBaseBytes is inspect's memory beyond its read buffers.
const inspectBaseBytes = 64 << 20

// inspectL3 runs `kvtier inspect l3 args...` with the module registries m.
func inspectL3(ctx context.Context, args []string, stdout, stderr io.Writer, m config.Modules) error {
	root := newRootCmd()
	for _, c := range root.Commands() {
		if c.Name() == "inspect" {
			root.RemoveCommand(c)
		}
	}
	root.AddCommand(groupCommand("inspect", "check a tier's on-disk state offline (l3)",
		newInspectL3Cmd(func() (config.Modules, error) { return m, nil })))
	return execute(ctx, root, append([]string{"inspect", "l3"}, args...), stdout, stderr)
}

// newInspectL3Cmd returns `kvtier inspect l3`, which opens the stack with
// the module registries modules returns.
func newInspectL3Cmd(modules func() (config.Modules, error)) *cobra.Command {
	cmd := &cobra.Command{
		Use: "l3 (--config FILE [--tier NAME] [--data-dir DIR --rank N] | --dir D[,D...] --index-dir DIR [--index lmdb|badger]) [--repair | --rebuild-index]",
		Long: `Checks l3disk slab files against their index offline (no store may have
them open): counts live, orphan, corrupt, lost and free slots and index
entries without a valid slot; exits 1 when it finds damage, repaired or
not. Without --repair or --rebuild-index it writes nothing and creates
nothing.`,
		Short: "check the L3 disk slabs and index offline (read-only unless repairing)",
		Example: `  kvtier inspect l3 --config stack.yaml
  kvtier inspect l3 --config stack.yaml --repair
  kvtier inspect l3 --dir /mnt/nvme0/kvtier,/mnt/nvme1/kvtier --index-dir /mnt/nvme0/kvtier/index --index lmdb`,
	}
	fs := cmd.Flags()
	var (
		cfgPath  = fs.String("config", "", "stack config `file`; its l3disk tier names the disks and the index (a config for serve: its placeholders expanded as serve would, {{DIR}} = --data-dir, {{RANK}} = --rank)")
		dataDir  = fs.String("data-dir", "", "with a serve config: serve's --data-dir `dir` (default: serve's default)")
		rank     = fs.Int("rank", 0, "with a serve config: the `rank` whose L3 to check")
		tierName = fs.String("tier", "", "the l3disk tier's `name` in the config (default: the only one)")
		dirs     dirList
		ixName   = fs.String("index", "", "index `module` (lmdb, badger) when no config is given (default: detected from --index-dir)")
		ixDir    = fs.String("index-dir", "", "index `directory` (when neither the config nor the index's own config names one)")
		stack    = fs.String("stack", "", "only check slab files of this stack `id`")
		repair   = fs.Bool("repair", false, "delete index entries that name no valid slot, extend truncated slab files (keeping their intact slots), and rebuild a corrupt or missing index from the slot headers")
		rebuild  = fs.Bool("rebuild-index", false, "replace the index's entries of these slab files with one per verified slot (creates the index if there is none; implies --repair)")
		depth    = countFlag(fs, "depth", 8, fmt.Sprintf("`number` of reads in flight (1 to %d)", maxInspectDepth))
		verbose  = fs.BoolP("verbose", "v", false, "log progress to stderr")
	)
	fs.Var(&dirs, "dir", "disk `directory` in disk-number order (repeat or comma-separate) when no config is given")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		m, err := modules()
		if err != nil {
			return err
		}
		ctx := cmd.Context()
		stdout := cmd.OutOrStdout()
		stderr := cmd.ErrOrStderr()
		if fs.NArg() > 0 {
			return fmt.Errorf("inspect l3: unexpected arguments %q: %w", fs.Args(), errUsage)
		}
		if err := (flagRange{Flag: "depth", Value: int64(*depth), Min: 1, Max: maxInspectDepth, MaxWhy: inspectDepthWhy}).check(); err != nil {
			return fmt.Errorf("inspect l3: %w: %w", err, errUsage)
		}
		logger := slog.New(slog.DiscardHandler)
		if *verbose {
			logger = slog.New(slog.NewTextHandler(stderr, nil))
		}
		write := *repair || *rebuild
		var ixUse string
		var ixCfg any
		switch {
		case *cfgPath != "" && len(dirs) > 0:
			return fmt.Errorf("inspect l3: give --config or --dir, not both: %w", errUsage)
		case *cfgPath != "":
			st, _, err := loadStackAs(*cfgPath, m, serveView{dataDir: *dataDir, rank: *rank})
			if err != nil {
				return fmt.Errorf("inspect l3: %w", err)
			}
			var found []config.Tier
			for _, t := range st.Tiers {
				if t.Use == l3disk.Name && (*tierName == "" || t.Name == *tierName) {
					found = append(found, t)
				}
			}
			if len(found) != 1 {
				return fmt.Errorf("inspect l3: %s has %d l3disk tiers matching --tier %q; name exactly one: %w", *cfgPath, len(found), *tierName, errUsage)
			}
			t := found[0]
			var slot int64
			for _, k := range st.Payload.Kinds {
				slot = max(slot, l3disk.SlotBytes(k.PageBytes))
			}
			if err := machineOf(ctx).memoryRange("depth", int64(*depth), 1, max(slot, 1), inspectBaseBytes, fmt.Sprintf("read in flight (a %s slot buffer)", bytesString(slot))).check(); err != nil {
				return fmt.Errorf("inspect l3: %w: %w", err, errUsage)
			}
			c, ok := t.Config.(*l3disk.Config)
			if !ok {
				return fmt.Errorf("inspect l3: tier %q config is %T, want *l3disk.Config", t.Name, t.Config)
			}
			for _, d := range c.Disks {
				dirs = append(dirs, d.Dir)
			}
			if t.Index == nil || t.Index.Use == "" {
				return fmt.Errorf("inspect l3: tier %q has no in-process index to check against (plugin indexes are not supported here)", t.Name)
			}
			ixUse, ixCfg = t.Index.Use, t.Index.Config
		case len(dirs) > 0:
			ixUse = *ixName
		default:
			return fmt.Errorf("inspect l3: give --config FILE or --dir D: %w", errUsage)
		}
		for i, d := range dirs {
			st, err := os.Stat(d)
			if err != nil {
				return fmt.Errorf("inspect l3: disk %d directory: %w", i, err)
			}
			if !st.IsDir() {
				return fmt.Errorf("inspect l3: disk %d: %s is not a directory", i, d)
			}
		}
		if ixCfg == nil && ixUse != "" {
			reg, err := m.Indexes.Lookup(indexes.IndexV1, ixUse)
			if err != nil {
				return fmt.Errorf("inspect l3: index: %w", err)
			}
			if reg.NewConfig != nil {
				ixCfg = reg.NewConfig()
			}
		}
		dir := indexDirOf(ixCfg, *ixDir)
		if dir == "" {
			return fmt.Errorf("inspect l3: no index directory: give --index-dir (or name one in the index config): %w", errUsage)
		}
		found := detectIndex(dir)
		switch {
		case ixUse == "" && found == "":
			return fmt.Errorf("inspect l3: no index in %s (no data.mdb, no MANIFEST); give --index lmdb|badger with --rebuild-index to create one from the slabs", dir)
		case ixUse == "":
			ixUse = found
		case found != "" && found != ixUse:
			return fmt.Errorf("inspect l3: %s holds a %s index, not %s", dir, found, ixUse)
		case found == "" && !*rebuild:
			return fmt.Errorf("inspect l3: no %s index in %s; nothing is created without --rebuild-index", ixUse, dir)
		}
		reg, err := m.Indexes.Lookup(indexes.IndexV1, ixUse)
		if err != nil {
			return fmt.Errorf("inspect l3: index: %w", err)
		}
		if ixCfg == nil && reg.NewConfig != nil {
			ixCfg = reg.NewConfig()
		}
		// NB: a read-only inspection must not move a damaged index aside.
		setOnCorrupt(ixCfg, write)
		ix, err := reg.Factory(ctx, indexes.Env{Logger: logger, Dir: dir}, ixCfg)
		if err != nil {
			if errors.Is(err, indexes.ErrCorrupt) {
				fmt.Fprintf(stdout, "index %s (%s): DAMAGED: %v\nstatus: DAMAGED\n", dir, ixUse, err)
				return fmt.Errorf("inspect l3: %w: the index is damaged (run with --repair to set it aside and rebuild it from the slabs)", errDamage)
			}
			return fmt.Errorf("inspect l3: open index %s: %w", ixUse, err)
		}
		rep, err := l3disk.Check(ctx, l3disk.CheckOptions{
			Dirs: dirs, StackID: *stack, Index: ix, Repair: *repair, RebuildIndex: *rebuild, Depth: *depth, Logger: logger,
		})
		err = errors.Join(err, ix.Close())
		if err != nil {
			return fmt.Errorf("inspect l3: %w", err)
		}
		writeCheckReport(stdout, rep, write)
		if rep.Damaged() {
			what := fmt.Sprintf("%d corrupt slots, %d lost slots, %d dangling entries, %d entries naming a missing file, %d entries newer than their file",
				rep.Corrupt, rep.Lost, rep.Dangling, rep.Missing, rep.Newer)
			if write {
				return fmt.Errorf("inspect l3: %w: %s; %d index entries repaired, %d pages indexed by the rebuild", errDamage, what, rep.Repaired, rep.Rebuilt.Kept)
			}
			return fmt.Errorf("inspect l3: %w: %s (run with --repair)", errDamage, what)
		}
		return nil
	}
	return cmd
}

// detectIndex names the index kept in dir by its files, "" if none.
func detectIndex(dir string) string {
	has := func(name string) bool {
		st, err := os.Stat(filepath.Join(dir, name))
		return err == nil && st.Size() > 0
	}
	switch {
	case has("data.mdb"):
		return lmdb.Name
	case has("MANIFEST") || has("KEYREGISTRY"):
		return badger.Name
	}
	return ""
}

// indexDirOf returns the directory an index config names, else fallback.
func indexDirOf(cfg any, fallback string) string {
	switch c := cfg.(type) {
	case *lmdb.Config:
		if c.Dir != "" {
			return c.Dir
		}
	case *badger.Config:
		if c.Dir != "" {
			return c.Dir
		}
	}
	return fallback
}

// setOnCorrupt makes an index refuse damaged files instead of setting
// them aside, unless the inspection may write.
func setOnCorrupt(cfg any, write bool) {
	mode := lmdb.OnCorruptRefuse
	if write {
		mode = lmdb.OnCorruptSetAside
	}
	switch c := cfg.(type) {
	case *lmdb.Config:
		c.OnCorrupt = mode
	case *badger.Config:
		c.OnCorrupt = mode
	}
}

func writeCheckReport(w io.Writer, rep l3disk.CheckReport, repair bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FILE\tDISK\tRANK\tKIND\tSTACK\tFORMAT\tEPOCH\tSLOTS\tLIVE\tORPHAN\tCORRUPT\tLOST\tFREE")
	for _, f := range rep.Files {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", f.Path, f.Disk, f.Rank, f.Kind, f.StackID,
			f.Format, f.Epoch>>16, f.Slots, f.Live, f.Orphan, f.Corrupt, f.Lost, f.Free)
	}
	_ = tw.Flush()
	for _, f := range rep.Files {
		if f.Problem != "" {
			fmt.Fprintf(w, "%s: %s\n", f.Path, f.Problem)
		}
		if f.Repaired != "" {
			fmt.Fprintf(w, "%s: repaired: %s\n", f.Path, f.Repaired)
		}
	}
	fmt.Fprintf(w, "slots: %d live, %d orphan, %d corrupt, %d lost, %d free\n", rep.Live, rep.Orphan, rep.Corrupt, rep.Lost, rep.Free)
	fmt.Fprintf(w, "index entries: %d without a valid slot, %d of an older epoch, %d of a newer epoch than their file (rolled back), %d naming a missing or unusable slab file, %d naming disks not scanned\n",
		rep.Dangling, rep.Stale, rep.Newer, rep.Missing, rep.Unchecked)
	if rep.IndexCorrupt != "" {
		fmt.Fprintf(w, "index: DAMAGED: %s\n", rep.IndexCorrupt)
	}
	for _, m := range rep.Unfinished {
		fmt.Fprintf(w, "index: INCOMPLETE: a rebuild of the index did not finish (%s exists); --repair or a cold start load rebuilds it\n", m)
	}
	if rep.AllOrphans {
		fmt.Fprintf(w, "index: names none of the %d valid pages in the slabs (missing, replaced or the wrong index)\n", rep.Orphan)
	}
	if repair {
		fmt.Fprintf(w, "repaired: %d index entries deleted\n", rep.Repaired)
		if rb := rep.Rebuilt; rb.Kept > 0 || rb.Corrupt > 0 || rb.Bytes > 0 {
			fmt.Fprintf(w, "rebuilt: index rebuilt from the slot headers: %d pages kept, %d corrupt slots, %d duplicates, %d unreadable\n",
				rb.Kept, rb.Corrupt, rb.Duplicates, rb.Unreadable)
		}
	}
	if rep.Damaged() {
		fmt.Fprintln(w, "status: DAMAGED")
	} else {
		fmt.Fprintln(w, "status: ok")
	}
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"

	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/tiers/l3disk"
)

// errDamage marks an inspection that found damage: exit status 1 with the
// counts already printed.
var errDamage = errors.New("damage found")

func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return fmt.Errorf("inspect: name a tier kind: l3: %w", errUsage)
	}
	switch args[0] {
	case "l3":
		return runInspectL3(ctx, args[1:], stdout, stderr)
	}
	return fmt.Errorf("inspect %q: unknown (known: l3): %w", args[0], errUsage)
}

// dirList is a repeatable, comma-separable --dir flag.
type dirList []string

func (d *dirList) String() string { return strings.Join(*d, ",") }
func (d *dirList) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*d = append(*d, p)
		}
	}
	return nil
}

func runInspectL3(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var m config.Modules
	var err error
	if m.Tiers, err = builtin.Tiers(); err != nil {
		return err
	}
	if m.Indexes, err = builtin.Indexes(); err != nil {
		return err
	}
	if m.Policies, err = builtin.Policies(); err != nil {
		return err
	}
	return inspectL3(ctx, args, stdout, stderr, m)
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

// inspectL3 is runInspectL3 with the module registries passed in.
func inspectL3(ctx context.Context, args []string, stdout, stderr io.Writer, m config.Modules) error {
	fs := flag.NewFlagSet("kvtier inspect l3", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfgPath  = fs.String("config", "", "stack config `file`; its l3disk tier names the disks and the index")
		tierName = fs.String("tier", "", "the l3disk tier's `name` in the config (default: the only one)")
		dirs     dirList
		ixName   = fs.String("index", "badger", "index `module` (lmdb, badger) when no config is given")
		ixDir    = fs.String("index-dir", "", "index `directory` (when neither the config nor the index's own config names one)")
		stack    = fs.String("stack", "", "only check slab files of this stack `id`")
		repair   = fs.Bool("repair", false, "delete index entries that name no valid slot")
		depth    = countFlag(fs, "depth", 8, fmt.Sprintf("`number` of reads in flight (1 to %d)", maxInspectDepth))
		verbose  = fs.Bool("v", false, "log progress to stderr")
	)
	fs.Var(&dirs, "dir", "disk `directory` in disk-number order (repeat or comma-separate) when no config is given")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: kvtier inspect l3 (--config FILE [--tier NAME] | --dir D[,D...] --index badger|lmdb --index-dir DIR) [--repair]")
		fmt.Fprintln(stderr, "\nChecks l3disk slab files against their index offline (no store may have them open):")
		fmt.Fprintln(stderr, "counts live, orphan, corrupt and free slots and index entries without a valid slot;")
		fmt.Fprintln(stderr, "exits 1 when it finds damage (corrupt slots or dangling entries), repaired or not.")
		fmt.Fprintln(stderr)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("inspect l3: %w: %w", err, errUsage)
	}
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
	ixReg := m.Indexes
	var ixUse string
	var ixCfg any
	switch {
	case *cfgPath != "" && len(dirs) > 0:
		return fmt.Errorf("inspect l3: give --config or --dir, not both: %w", errUsage)
	case *cfgPath != "":
		st, err := config.LoadFile(*cfgPath, m)
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
	reg, err := ixReg.Lookup(indexes.IndexV1, ixUse)
	if err != nil {
		return fmt.Errorf("inspect l3: index: %w", err)
	}
	if ixCfg == nil && reg.NewConfig != nil {
		ixCfg = reg.NewConfig()
	}
	ix, err := reg.Factory(ctx, indexes.Env{Logger: logger, Dir: *ixDir}, ixCfg)
	if err != nil {
		return fmt.Errorf("inspect l3: open index %s: %w", ixUse, err)
	}
	rep, err := l3disk.Check(ctx, l3disk.CheckOptions{
		Dirs: dirs, StackID: *stack, Index: ix, Repair: *repair, Depth: *depth, Logger: logger,
	})
	err = errors.Join(err, ix.Close())
	if err != nil {
		return fmt.Errorf("inspect l3: %w", err)
	}
	writeCheckReport(stdout, rep, *repair)
	if rep.Damaged() {
		if *repair {
			return fmt.Errorf("inspect l3: %w: %d corrupt slots, %d dangling entries; %d index entries repaired", errDamage, rep.Corrupt, rep.Dangling, rep.Repaired)
		}
		return fmt.Errorf("inspect l3: %w: %d corrupt slots, %d dangling entries (run with --repair to drop their index entries)", errDamage, rep.Corrupt, rep.Dangling)
	}
	return nil
}

func writeCheckReport(w io.Writer, rep l3disk.CheckReport, repair bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FILE\tDISK\tRANK\tKIND\tSTACK\tEPOCH\tSLOTS\tLIVE\tORPHAN\tCORRUPT\tFREE")
	for _, f := range rep.Files {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\n", f.Path, f.Disk, f.Rank, f.Kind, f.StackID,
			f.Epoch>>16, f.Slots, f.Live, f.Orphan, f.Corrupt, f.Free)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "slots: %d live, %d orphan, %d corrupt, %d free\n", rep.Live, rep.Orphan, rep.Corrupt, rep.Free)
	fmt.Fprintf(w, "index entries: %d without a valid slot, %d of an older epoch, %d naming files not scanned\n", rep.Dangling, rep.Stale, rep.Unchecked)
	if repair {
		fmt.Fprintf(w, "repaired: %d index entries deleted\n", rep.Repaired)
	}
	if rep.Damaged() {
		fmt.Fprintln(w, "status: DAMAGED")
	} else {
		fmt.Fprintln(w, "status: ok")
	}
}

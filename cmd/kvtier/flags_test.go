package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/bench/l2bench"
	"github.com/kvtier/kvtier/bench/l3bench"
	"github.com/kvtier/kvtier/host/config"
	"github.com/spf13/cobra"
)

// smallMachine is a pinned machine for the limit tests: 2 GiB of memory
// and 10 GiB free in every directory that exists.
func smallMachine() machine {
	return machine{
		MemAvailable: 2 << 30,
		MemSource:    "the test's machine",
		FreeDisk: func(dir string) (int64, error) {
			if _, err := os.Stat(dir); err != nil {
				return 0, err
			}
			return 10 << 30, nil
		},
	}
}

// TestFlagLimits: every count and size flag of every subcommand refuses a
// value below its minimum or beyond what the (pinned) machine holds, with
// a usage error that names the flag, the value and the limit, before the
// command does any work.
func TestFlagLimits(t *testing.T) {
	dir := t.TempDir()
	trace := writeTrace(t, dir)
	stack := filepath.Join(dir, "stack.yaml")
	if err := os.WriteFile(stack, config.DefaultYAML(), 0o644); err != nil {
		t.Fatal(err)
	}
	l3dir := filepath.Join(dir, "l3")
	if err := os.Mkdir(l3dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := withMachine(context.Background(), smallMachine())
	for _, c := range []struct {
		name string
		args []string
		want []string // every one must appear in the error
	}{
		// replay
		{"replay parallel 0", []string{"replay", trace, "--parallel", "0"}, []string{"--parallel 0: must be at least 1"}},
		{"replay parallel -1", []string{"replay", trace, "--parallel", "-1"}, []string{"--parallel -1: must be at least 1"}},
		{"replay parallel beyond memory", []string{"replay", trace, "--parallel", "1e6"}, []string{"--parallel 1000000: at most", "of memory per replay running at once", "2.0 GiB available"}},
		{"replay sweep-points 0", []string{"replay", trace, "--sweep", "--sweep-points", "0"}, []string{"--sweep-points 0: must be at least 2"}},
		{"replay sweep-points 1", []string{"replay", trace, "--sweep", "--sweep-points", "1"}, []string{"--sweep-points 1: must be at least 2"}},
		{"replay sweep-points 1e8", []string{"replay", trace, "--sweep", "--sweep-points", "1e8"}, []string{"--sweep-points 100000000: at most", "unique blocks"}},
		{"replay sweep-points not whole", []string{"replay", trace, "--sweep", "--sweep-points", "2.5"}, []string{`"2.5" is not a whole number`, "sweep-points"}},
		{"replay capacity empty", []string{"replay", trace, "--capacity", ""}, []string{`--capacity "": empty`}},
		{"replay capacity blank", []string{"replay", trace, "--capacity", "  "}, []string{`--capacity "": empty`}},
		// a cost computed from another flag that is out of range (it
		// divided by zero: bench group --ranks 0 panicked)
		{"bench group ranks 0", []string{"bench", "group", "--ranks", "0"}, []string{"--ranks 0: must be at least 2"}},
		{"bench group rounds 0", []string{"bench", "group", "--rounds", "0"}, []string{"--rounds 0: must be at least 1"}},
		{"bench group ranks -1", []string{"bench", "group", "--ranks", "-1"}, []string{"--ranks -1: must be at least 2"}},
		// bench redis: refused before a redis-server starts (a batch or
		// page past memory died in makeslice)
		{"bench redis batch beyond memory", []string{"bench", "redis", "--batch", "99999999999999"}, []string{"--batch 99999999999999: at most", "of memory per page of the batch"}},
		{"bench redis page-kib beyond bound", []string{"bench", "redis", "--page-kib", "99999999999999"}, []string{"--page-kib 99999999999999: at most 65536"}},
		{"bench redis page-kib 0", []string{"bench", "redis", "--page-kib", "0"}, []string{"--page-kib 0: must be at least 1"}},
		// serve: the rank group
		{"serve group unknown", []string{"serve", "--data-dir", dir, "--group", "mpi"}, []string{`--group "mpi"`, "inproc, engine or tcp"}},
		{"serve group tcp without size", []string{"serve", "--data-dir", dir, "--group", "tcp", "--group-hub", "127.0.0.1:1"}, []string{"--group tcp needs --group-size N"}},
		{"serve group tcp rank outside", []string{"serve", "--data-dir", dir, "--group", "tcp", "--group-size", "2", "--group-rank", "2", "--group-hub", "127.0.0.1:1"}, []string{"--group-rank in 0..N-1"}},
		{"serve group-hub without tcp", []string{"serve", "--data-dir", dir, "--group-hub", "127.0.0.1:1"}, []string{"go with --group tcp"}},
		{"serve group-timeout 0", []string{"serve", "--data-dir", dir, "--group-timeout", "0s"}, []string{"--group-timeout 0s: want 100ms..1h"}},
		// serve: the doors
		{"serve door unknown", []string{"serve", "--data-dir", dir, "--doors", "engine,kv"}, []string{`door "kv": want "engine" or "store"`}},
		{"serve doors empty list", []string{"serve", "--data-dir", dir, "--doors", ","}, []string{"name at least one"}},
		{"serve store lease 0", []string{"serve", "--data-dir", dir, "--store-lease", "0s"}, []string{"--store-lease 0s: want 100ms..1h"}},
		{"serve plan-timeout 0", []string{"serve", "--data-dir", dir, "--plan-timeout", "0s"}, []string{"--plan-timeout 0s: want 100ms..24h"}},
		{"serve max-message-bytes 1000", []string{"serve", "--data-dir", dir, "--max-message-bytes", "1000"}, []string{"--max-message-bytes 1000: want 1048576..1073741824"}},
		{"serve max-message-bytes 2GiB", []string{"serve", "--data-dir", dir, "--max-message-bytes", "2147483648"}, []string{"--max-message-bytes 2147483648: want"}},
		{"serve record-max-bytes tiny", []string{"serve", "--data-dir", dir, "--record-max-bytes", "5"}, []string{`--record-max-bytes "5": want a size in 1MiB..1TiB`}},
		{"serve record-max-bytes junk", []string{"serve", "--data-dir", dir, "--record-max-bytes", "lots"}, []string{`--record-max-bytes "lots"`}},
		{"serve record-keep 0", []string{"serve", "--data-dir", dir, "--record-keep", "0"}, []string{"--record-keep 0: want 1..10000"}},
		// bench planner
		{"planner candidates 2e9", []string{"bench", "planner", "--candidates", "2e9"}, []string{"--candidates 2000000000: at most 1048576", "2.0 KiB of memory per candidate"}},
		{"planner candidates 0", []string{"bench", "planner", "--candidates", "0"}, []string{"--candidates 0: must be at least 1"}},
		{"planner rounds 0", []string{"bench", "planner", "--rounds", "0"}, []string{"--rounds 0: must be at least 1"}},
		{"planner rounds 1e5", []string{"bench", "planner", "--rounds", "1e5"}, []string{"--rounds 100000: at most 10000"}},
		// bench radix
		{"radix rounds 0", []string{"bench", "radix", "--trace", trace, "--rounds", "0"}, []string{"--rounds 0: must be at least 1"}},
		{"radix rounds 1e6", []string{"bench", "radix", "--trace", trace, "--rounds", "1e6"}, []string{"--rounds 1000000: at most 10000"}},
		// bench serve
		{"serve page-bytes odd", []string{"bench", "serve", "--page-bytes", "1000"}, []string{"--page-bytes 1000: want a multiple of 4KiB"}},
		{"serve page-bytes junk", []string{"bench", "serve", "--page-bytes", "big"}, []string{"--page-bytes"}},
		{"serve page-bytes memory", []string{"bench", "serve", "--page-bytes", "2816KiB", "--max-pages", "64", "--sessions", "16"}, []string{"needs 22GiB of memory", "has 2GiB"}},
		{"serve rounds none", []string{"bench", "serve", "--rounds", "2", "--l3", "none"}, []string{"--rounds compares --l3 none with no L3"}},
		{"serve rounds 1e3", []string{"bench", "serve", "--rounds", "1000"}, []string{"--rounds 1000: want 0..100"}},
		{"serve max-pages 0", []string{"bench", "serve", "--max-pages", "0"}, []string{"--max-pages 0: want 1..4096"}},
		// bench l2
		{"l2 copy-mib 0", []string{"bench", "l2", "--copy-mib", "0"}, []string{"--copy-mib 0: must be at least 1"}},
		{"l2 copy-mib 1e6", []string{"bench", "l2", "--copy-mib", "1e6"}, []string{"--copy-mib 1000000: at most", "of memory per MiB"}},
		{"l2 live 0", []string{"bench", "l2", "--live", "0"}, []string{"--live 0: must be at least 1"}},
		{"l2 live 1e9", []string{"bench", "l2", "--live", "1e9"}, []string{"--live 1000000000: at most", "per live object"}},
		{"l2 digest-pages 0", []string{"bench", "l2", "--digest-pages", "0"}, []string{"--digest-pages 0: must be at least 1"}},
		{"l2 digest-pages 1e12", []string{"bench", "l2", "--digest-pages", "1e12"}, []string{"--digest-pages 1000000000000: at most", "per digest page"}},
		// bench l3
		{"l3 pages 1e9", []string{"bench", "l3", "--dir", l3dir, "--pages", "1e9"}, []string{"--pages 1000000000: at most", "of disk per page", "10.0 GiB free in " + l3dir}},
		{"l3 pages 0", []string{"bench", "l3", "--dir", l3dir, "--pages", "0"}, []string{"--pages 0: must be at least 1"}},
		{"l3 batch 0", []string{"bench", "l3", "--dir", l3dir, "--batch", "0"}, []string{"--batch 0: must be at least 1"}},
		{"l3 batch 1e6", []string{"bench", "l3", "--dir", l3dir, "--batch", "1e6"}, []string{"--batch 1000000: at most", "of memory per page of the batch"}},
		{"l3 depth 0", []string{"bench", "l3", "--dir", l3dir, "--depth", "0"}, []string{"--depth 0: must be at least 1"}},
		{"l3 depth 1e6", []string{"bench", "l3", "--dir", l3dir, "--depth", "1e6"}, []string{"--depth 1000000: at most", "per I/O in flight"}},
		{"l3 rounds 0", []string{"bench", "l3", "--dir", l3dir, "--rounds", "0"}, []string{"--rounds 0: must be at least 1"}},
		{"l3 rounds 1e5", []string{"bench", "l3", "--dir", l3dir, "--rounds", "1e5"}, []string{"--rounds 100000: at most 10000"}},
		{"l3 page-bytes 1TiB", []string{"bench", "l3", "--dir", l3dir, "--page-bytes", "1TiB"}, []string{"--page-bytes 1099511627776: at most", "a page is held at least 8 times"}},
		{"l3 missing dir", []string{"bench", "l3", "--dir", filepath.Join(dir, "none")}, []string{"--dir " + filepath.Join(dir, "none")}},
		// bench plugin
		{"plugin batch 0", []string{"bench", "plugin", "--batch", "0"}, []string{"--batch 0: must be at least 1"}},
		{"plugin batch 1e6", []string{"bench", "plugin", "--batch", "1e6"}, []string{"--batch 1000000: at most", "held three times"}},
		{"plugin rounds 0", []string{"bench", "plugin", "--rounds", "0"}, []string{"--rounds 0: must be at least 1"}},
		// inspect l3
		{"inspect depth 0", []string{"inspect", "l3", "--dir", l3dir, "--depth", "0"}, []string{"--depth 0: must be at least 1"}},
		{"inspect depth 5000", []string{"inspect", "l3", "--dir", l3dir, "--depth", "5000"}, []string{"--depth 5000: at most 1024"}},
		{"inspect depth beyond memory", []string{"inspect", "l3", "--config", stack, "--depth", "1000"}, []string{"--depth 1000: at most", "per read in flight"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(ctx, c.args, &out, &errOut)
			if err == nil {
				t.Fatalf("%q: accepted, want an error containing %q", c.args, c.want)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q: error %q lacks %q", c.args, err, w)
				}
			}
			if !errors.Is(err, errUsage) {
				t.Errorf("%q: %v is not a usage error", c.args, err)
			}
			if out.Len() != 0 {
				t.Errorf("%q: refused but printed %q", c.args, out.String())
			}
		})
	}
	if entries, err := os.ReadDir(l3dir); err != nil || len(entries) != 0 {
		t.Errorf("refused bench l3 runs left %v in --dir (%v)", entries, err)
	}
}

// TestMemoryShareNamesTheOutlier: of flags that share memory, the one given
// an outlandish value is the one named, whatever its position.
func TestMemoryShareNamesTheOutlier(t *testing.T) {
	m := smallMachine()
	for _, c := range []struct {
		a, b int64
		want string
	}{
		{1e12, 10, "--a 1000000000000"},
		{10, 1e12, "--b 1000000000000"},
		{600, 600, "--a 600"}, // each fits alone, not both: the first is named
		{math.MaxInt64, math.MaxInt64, "--a 9223372036854775807"},
	} {
		err := m.checkMemoryShares(0,
			memoryShare{Flag: "a", Value: c.a, Min: 1, PerUnit: 2 << 20, UnitName: "a"},
			memoryShare{Flag: "b", Value: c.b, Min: 1, PerUnit: 2 << 20, UnitName: "b"})
		if err == nil || !strings.HasPrefix(err.Error(), c.want+": at most") {
			t.Errorf("a=%d b=%d: %v, want an error starting %q", c.a, c.b, err, c.want)
		}
	}
	if err := m.checkMemoryShares(0,
		memoryShare{Flag: "a", Value: 100, Min: 1, PerUnit: 2 << 20, UnitName: "a"},
		memoryShare{Flag: "b", Value: 100, Min: 1, PerUnit: 2 << 20, UnitName: "b"}); err != nil {
		t.Errorf("400 MiB of 2 GiB: %v", err)
	}
}

// TestDefaultsWithinLimits: the defaults of the benches pass their checks
// on a machine with 2 GiB free, so the checks refuse only what was asked
// for.
func TestDefaultsWithinLimits(t *testing.T) {
	m := smallMachine()
	l3 := l3bench.DefaultOptions()
	l3.Dir = t.TempDir()
	if err := checkBenchL3(m, l3, true); err != nil {
		t.Errorf("bench l3 defaults: %v", err)
	}
	l2 := l2bench.DefaultOptions()
	if err := checkBenchL2(m, l2, l2.CopyBytes>>20); err != nil {
		t.Errorf("bench l2 defaults: %v", err)
	}
}

func TestParseCount(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		err  string
	}{
		{"0", 0, ""},
		{"12", 12, ""},
		{"-1", -1, ""},
		{"+7", 7, ""},
		{"1e8", 100_000_000, ""},
		{"2e9", 2_000_000_000, ""},
		{"2.5e3", 2500, ""},
		{"1E3", 1000, ""},
		{"3.0", 3, ""},
		{"9223372036854775807", math.MaxInt64, ""},
		{"9007199254740992", 1 << 53, ""},
		{"9e15", 9e15, ""},
		{"1e16", 0, "too large to be exact"},
		{"1e300", 0, "too large to be exact"},
		{"1e400", 0, "too large to be exact"},
		{"99999999999999999999", 0, "out of the range"},
		{"1.5", 0, "not a whole number"},
		{"1e-3", 0, "not a whole number"},
		{"", 0, "not a whole number"},
		{"inf", 0, "not a whole number"},
		{"NaN", 0, "not a whole number"},
		{"0x10", 0, "not a whole number"},
		{"0x1p4", 0, "not a whole number"},
		{"1_000", 0, "not a whole number"},
		{"12abc", 0, "not a whole number"},
		{".5e1", 0, "not a whole number"},
	} {
		got, err := parseCount(c.in)
		switch {
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("parseCount(%q) = %d, %v; want %d", c.in, got, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("parseCount(%q) = %d, %v; want an error containing %q", c.in, got, err, c.err)
		}
	}
}

func FuzzParseCount(f *testing.F) {
	for _, s := range []string{"0", "12", "-1", "1e8", "2.5e3", "1e16", "9223372036854775807", "1.5", "inf", "0x1p4", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseCount(s)
		if err != nil {
			if n != 0 {
				t.Fatalf("parseCount(%q) = %d with error %v", s, n, err)
			}
			return
		}
		// A plain integer reads as itself; anything else is whole and exact.
		if want, perr := strconv.ParseInt(s, 10, 64); perr == nil {
			if n != want {
				t.Fatalf("parseCount(%q) = %d, want %d", s, n, want)
			}
			return
		}
		f, perr := strconv.ParseFloat(s, 64)
		if perr != nil || f != float64(n) || math.Abs(f) > maxExactCount {
			t.Fatalf("parseCount(%q) = %d, but it reads as %v (%v)", s, n, f, perr)
		}
	})
}

// TestHostMachine: this host's available memory comes from procfs's
// MemAvailable (or sysinfo), and is positive.
func TestHostMachine(t *testing.T) {
	m := hostMachine()
	if m.MemAvailable <= 0 || m.MemSource == "" {
		t.Fatalf("host machine: %d bytes from %q", m.MemAvailable, m.MemSource)
	}
}

// TestFlagsAnywhere: flags before, between and after the positional
// arguments, "--" ends the flags, as every kvtier command parses them.
func TestFlagsAnywhere(t *testing.T) {
	tests := []struct {
		args []string
		x    string
		v    bool
		pos  []string
	}{
		{[]string{"a", "--x", "1", "b"}, "1", false, []string{"a", "b"}},
		{[]string{"--x=2", "a", "-v"}, "2", true, []string{"a"}},
		{[]string{"a", "b"}, "", false, []string{"a", "b"}},
		{[]string{"--", "-x", "3"}, "", false, []string{"-x", "3"}},
		{[]string{"a", "-v", "--", "--x", "b"}, "", true, []string{"a", "--x", "b"}},
		{nil, "", false, nil},
	}
	probe := func() (*cobra.Command, *string, *bool, *[]string) {
		var pos []string
		c := &cobra.Command{Use: "probe", RunE: func(_ *cobra.Command, args []string) error { pos = args; return nil }}
		x := c.Flags().String("x", "", "")
		v := c.Flags().BoolP("verbose", "v", false, "")
		root := newRootCmd()
		root.AddCommand(c)
		return root, x, v, &pos
	}
	for _, tc := range tests {
		root, x, v, pos := probe()
		if err := execute(context.Background(), root, append([]string{"probe"}, tc.args...), io.Discard, io.Discard); err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if *x != tc.x || *v != tc.v || !slices.Equal(*pos, tc.pos) {
			t.Errorf("%q: x=%q v=%v args %q, want %q %v %q", tc.args, *x, *v, *pos, tc.x, tc.v, tc.pos)
		}
	}
	root, _, _, _ := probe()
	err := execute(context.Background(), root, []string{"probe", "a", "--nope"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "nope") || !errors.Is(err, errUsage) {
		t.Errorf("unknown flag after a positional: %v, want a usage error naming it", err)
	}
}

// TestSuggestions: an unknown command or flag is a usage error that names
// the nearest one; --help returns flag.ErrHelp for every command.
func TestSuggestions(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"genrate"}, "did you mean generate?"},
		{[]string{"bench", "radx"}, "did you mean radix?"},
		{[]string{"bench", "radx", "--help"}, "did you mean radix?"},
		{[]string{"config", "valdate", "x.yaml"}, "did you mean validate?"},
		{[]string{"generate", "--sed", "3"}, "did you mean --seed?"},
		{[]string{"serve", "--sokcet", "/tmp/s"}, "did you mean --socket?"},
		{[]string{"loadgen", "-socket", "/tmp/s"}, "did you mean --socket? long flags take two dashes"},
		{[]string{"version", "now"}, "takes no arguments"},
		{[]string{"bench"}, "name a command: one of"},
	} {
		err := run(context.Background(), c.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want a usage error containing %q", c.args, err, c.want)
		}
	}
	var walk func(prefix []string, c *cobra.Command)
	walk = func(prefix []string, c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" {
				continue
			}
			args := append(slices.Clone(prefix), sub.Name())
			var out bytes.Buffer
			if err := run(context.Background(), append(args, "--help"), &out, io.Discard); !errors.Is(err, flag.ErrHelp) {
				t.Errorf("kvtier %s --help: %v, want flag.ErrHelp", strings.Join(args, " "), err)
			}
			if !strings.Contains(out.String(), "Usage:") || (sub.Runnable() && !strings.Contains(out.String(), "Examples:") && sub.Parent().Name() != "completion") {
				t.Errorf("kvtier %s --help: no usage or no examples:\n%s", strings.Join(args, " "), out.String())
			}
			walk(args, sub)
		}
	}
	walk(nil, newRootCmd())
	var script bytes.Buffer
	if err := run(context.Background(), []string{"completion", "bash"}, &script, io.Discard); err != nil || !strings.Contains(script.String(), "kvtier") {
		t.Errorf("completion bash: %v (%d bytes)", err, script.Len())
	}
}

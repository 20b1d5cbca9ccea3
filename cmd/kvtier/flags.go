package main

// Flag ranges. Every count and size flag of every subcommand is checked
// before the command allocates or writes anything: at least its minimum,
// and at most what this machine can hold, from the memory the kernel says
// is available (/proc/meminfo MemAvailable, else sysinfo) and the free space
// of the target directory (statfs). Flags whose cost is time rather than
// memory (every --rounds, inspect's --depth without a config) get a fixed
// bound that says why. The per-unit costs, beside each command's flags, were
// measured with /usr/bin/time -f %M on the commands they bound and then
// doubled or more for the garbage collector's headroom: a limit guards
// against running the machine out of memory or disk; it does not promise
// that a run just below it fits.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

// countValue is a count flag: a whole number written plainly (100000) or
// in exponent notation (1e8, 2.5e3), so the figures people type are read
// as they meant them and then checked against the flag's range, instead of
// failing with a bare parse error.
type countValue[T int | int64] struct{ p *T }

func (v countValue[T]) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.FormatInt(int64(*v.p), 10)
}

func (v countValue[T]) Set(s string) error {
	n, err := parseCount(s)
	if err != nil {
		return err
	}
	if int64(T(n)) != n {
		return fmt.Errorf("%d does not fit in this flag", n)
	}
	*v.p = T(n)
	return nil
}

// Type names the value in --help.
func (v countValue[T]) Type() string { return "count" }

// countFlag defines a count flag of type int on fs.
func countFlag(fs *pflag.FlagSet, name string, value int, usage string) *int {
	p := new(int)
	*p = value
	fs.Var(countValue[int]{p}, name, usage)
	return p
}

// countVar defines a count flag stored in p, with p's value as default.
func countVar[T int | int64](fs *pflag.FlagSet, p *T, name, usage string) {
	fs.Var(countValue[T]{p}, name, usage)
}

// maxExactCount is the largest count exponent notation can state exactly
// (2^53): beyond it a float64 skips integers.
const maxExactCount = 1 << 53

// parseCount reads a whole number: decimal digits with an optional sign, or
// a number in exponent or decimal-point notation that is whole and at most
// 2^53 in magnitude. Its cost is bounded by the length of s.
func parseCount(s string) (int64, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, nil
	} else if errors.Is(err, strconv.ErrRange) {
		return 0, fmt.Errorf("%q is out of the range of a count (at most %d)", s, int64(math.MaxInt64))
	}
	t := strings.TrimLeft(s, "+-")
	if t == "" || t[0] < '0' || t[0] > '9' || strings.Trim(t, "0123456789.eE+-") != "" {
		// NB: ParseFloat also reads "inf", "nan", hexadecimal floats and
		// digits with underscores; a count is a plain decimal number.
		return 0, fmt.Errorf("%q is not a whole number", s)
	}
	f, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange):
		return 0, fmt.Errorf("%q is not a whole number", s)
	case err != nil || math.Abs(f) > maxExactCount:
		return 0, fmt.Errorf("%q is too large to be exact in exponent notation (at most 2^53 = %d; write the digits)", s, int64(maxExactCount))
	case f != math.Trunc(f):
		return 0, fmt.Errorf("%q is not a whole number", s)
	}
	return int64(f), nil
}

// machine is what this host has to give a command: memory and free disk.
type machine struct {
	// MemAvailable is the memory a new process may use without swapping,
	// in bytes; MemSource says where the figure comes from.
	MemAvailable int64
	MemSource    string
	// FreeDisk returns the bytes an unprivileged writer may still use on
	// the file system holding dir.
	FreeDisk func(dir string) (int64, error)
}

type machineKey struct{}

// withMachine returns ctx carrying m, for tests that pin the machine.
func withMachine(ctx context.Context, m machine) context.Context {
	return context.WithValue(ctx, machineKey{}, m)
}

// machineOf returns the machine ctx carries, else this host's, read now.
func machineOf(ctx context.Context) machine {
	if m, ok := ctx.Value(machineKey{}).(machine); ok {
		return m
	}
	return hostMachine()
}

// hostMachine reads this host: MemAvailable from /proc/meminfo (free
// memory plus what the kernel can reclaim), else sysinfo's free and buffer
// memory, else no limit it can state (math.MaxInt64, said so).
func hostMachine() machine {
	m := machine{FreeDisk: statfsFree}
	if fs, err := procfs.NewDefaultFS(); err == nil {
		if mi, err := fs.Meminfo(); err == nil && mi.MemAvailableBytes != nil && *mi.MemAvailableBytes <= math.MaxInt64 {
			m.MemAvailable, m.MemSource = int64(*mi.MemAvailableBytes), "MemAvailable in /proc/meminfo"
			return m
		}
	}
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err == nil {
		unit := max(int64(si.Unit), 1)
		m.MemAvailable = saturatingMul(int64(si.Freeram)+int64(si.Bufferram), unit)
		m.MemSource = "sysinfo (free + buffer memory)"
		return m
	}
	m.MemAvailable, m.MemSource = math.MaxInt64, "an unknown source (neither /proc/meminfo nor sysinfo could be read)"
	return m
}

// statfsFree returns the bytes available to an unprivileged writer on the
// file system holding dir.
func statfsFree(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return saturatingMul(int64(st.Bavail), int64(st.Bsize)), nil
}

// saturatingMul returns a*b for non-negative a and b, or math.MaxInt64
// where that overflows.
func saturatingMul(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}

// bytesString formats n bytes for an error message: "12.3 GiB".
func bytesString(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n), -1
	for f >= unit && i < 5 {
		f /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", f, "KMGTPE"[i])
}

// flagRange is one flag's value and the range it must lie in.
type flagRange struct {
	// Flag is the flag's name without dashes; Value what was given.
	Flag  string
	Value int64
	// Shown, if set, replaces "--flag value" in messages, for a value
	// that is not the flag's text (the number of capacities in a list).
	Shown string
	// Min is the least value; MinWhy, if set, says why.
	Min    int64
	MinWhy string
	// Max is the greatest value; MaxWhy says what it comes from (the
	// machine's memory, its free disk, or a fixed bound and why).
	Max    int64
	MaxWhy string
}

// check returns nil when the value lies in range, else an error naming the
// flag, its value and the limit it broke.
func (r flagRange) check() error {
	shown := r.Shown
	if shown == "" {
		shown = fmt.Sprintf("--%s %d", r.Flag, r.Value)
	}
	if r.Value < r.Min {
		msg := fmt.Sprintf("%s: must be at least %d", shown, r.Min)
		if r.MinWhy != "" {
			msg += " (" + r.MinWhy + ")"
		}
		return errors.New(msg)
	}
	if r.Value > r.Max {
		return fmt.Errorf("%s: at most %d (%s)", shown, r.Max, r.MaxWhy)
	}
	return nil
}

// checkRanges checks rs in order and returns the first failure.
func checkRanges(rs ...flagRange) error {
	for _, r := range rs {
		if err := r.check(); err != nil {
			return err
		}
	}
	return nil
}

// memoryRange is the range of a flag whose every unit costs perUnit bytes
// of memory on top of fixed bytes that the rest of the command needs: at
// most (available - fixed) / perUnit units.
//
// A perUnit of zero or less (a cost computed from another flag that is
// itself out of range, checked in the same checkRanges call) bounds
// nothing: that flag's own check reports it.
func (m machine) memoryRange(flagName string, value, minimum, perUnit, fixed int64, unitName string) flagRange {
	left := m.MemAvailable - fixed
	if perUnit <= 0 {
		return flagRange{Flag: flagName, Value: value, Min: minimum, Max: math.MaxInt64}
	}
	r := flagRange{Flag: flagName, Value: value, Min: minimum, Max: max(left, 0) / perUnit}
	r.MaxWhy = fmt.Sprintf("about %s of memory per %s", bytesString(perUnit), unitName)
	if fixed > 0 {
		r.MaxWhy += fmt.Sprintf(" plus %s for the rest of the run", bytesString(fixed))
	}
	r.MaxWhy += fmt.Sprintf("; %s available per %s", bytesString(m.MemAvailable), m.MemSource)
	return r
}

// memoryShare is one flag of several that share the machine's memory.
type memoryShare struct {
	// Flag, Value, Shown and Min are as in flagRange.
	Flag       string
	Value, Min int64
	Shown      string
	// PerUnit is the memory of one unit of Value; UnitName names a unit.
	PerUnit  int64
	UnitName string
}

// checkMemoryShares checks flags that share the machine's memory on top of
// fixed bytes: first each alone (so the flag given an outlandish value is
// the one named), then each with the others at their given values.
func (m machine) checkMemoryShares(fixed int64, shares ...memoryShare) error {
	costs := make([]int64, len(shares))
	var total int64
	for i, sh := range shares {
		costs[i] = saturatingMul(max(sh.Value, 0), sh.PerUnit)
		total = saturatingAdd(total, costs[i])
		if err := sh.within(m, fixed); err != nil {
			return err
		}
	}
	for i, sh := range shares {
		others := saturatingAdd(fixed, total-costs[i])
		if total == math.MaxInt64 {
			others = math.MaxInt64
		}
		if err := sh.within(m, others); err != nil {
			return err
		}
	}
	return nil
}

// within checks sh against m's memory on top of fixed bytes.
func (sh memoryShare) within(m machine, fixed int64) error {
	r := m.memoryRange(sh.Flag, sh.Value, sh.Min, sh.PerUnit, fixed, sh.UnitName)
	r.Shown = sh.Shown
	return r.check()
}

// saturatingAdd returns a+b for non-negative a and b, or math.MaxInt64
// where that overflows.
func saturatingAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// maxRounds bounds every --rounds flag: rounds cost time, not memory, and
// past a few hundred a median no longer moves; a larger value is a typo.
const maxRounds = 10_000

// roundsRange is the range of a --rounds flag.
func roundsRange(flagName string, value int64) flagRange {
	return flagRange{Flag: flagName, Value: value, Min: 1, Max: maxRounds,
		MaxWhy: fmt.Sprintf("a fixed bound: rounds cost time, and a median of %d rounds no longer moves", maxRounds)}
}

// splitList splits a comma-separated flag value into its trimmed,
// non-empty items (nil for an empty value).
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Package doctor is the preflight of a kvtier node: the checks a platform
// engineer runs (`kvtier doctor`) before `kvtier serve`, so that a missing
// hugepage reservation, a low memlock limit, a file system that refuses
// O_DIRECT, a disk without power-loss protection, a full disk, a small LMDB
// map, an unsafe socket directory or a plugin binary that is not the pinned
// one is found with an actionable message before traffic arrives, not as a
// cryptic failure at open.
//
// Every check reads the machine through a System, so tests inject /proc
// contents, statfs answers and probe results and cover each check's pass,
// warn and fail paths without root. The checks only look: apart from the
// scratch files of the O_DIRECT and power-loss probes (removed at once),
// this package must never create, change or delete anything on the machine,
// and it never opens a tier, an index or a plugin.
package doctor

import (
	"context"
	"fmt"
	"strings"

	"github.com/kvtier/kvtier/host/config"
)

// Status is the outcome of one check.
type Status string

// Statuses, from best to worst.
const (
	// Pass: nothing to do.
	Pass Status = "pass"
	// Warn: serve will run, degraded or with a risk the message names.
	Warn Status = "warn"
	// Fail: serve will fail (or must not be trusted) until the message's
	// advice is followed.
	Fail Status = "fail"
)

func (s Status) rank() int {
	switch s {
	case Pass:
		return 0
	case Warn:
		return 1
	}
	return 2
}

// worse returns the worse of a and b.
func worse(a, b Status) Status {
	if b.rank() > a.rank() {
		return b
	}
	return a
}

// Names of the checks, in the order Run reports them.
const (
	// CheckHugepages compares the free 2 MiB hugepages with the L2 slab size.
	CheckHugepages = "hugepages"
	// CheckHugetlbfsMount checks the slab's hugetlbfs mount: present,
	// hugetlbfs, 2 MiB pages, writable.
	CheckHugetlbfsMount = "hugetlbfs_mount"
	// CheckMemlock compares RLIMIT_MEMLOCK with what the slab and an L1
	// pool would pin.
	CheckMemlock = "memlock"
	// CheckODirect writes one aligned 4 KiB block with O_DIRECT in each L3
	// disk directory.
	CheckODirect = "o_direct"
	// CheckPLP runs the L3 power-loss-protection probe (fdatasync latency)
	// on each L3 disk.
	CheckPLP = "plp"
	// CheckDiskFree compares the free space of each L3 file system with the
	// budgets of the disks on it.
	CheckDiskFree = "disk_free"
	// CheckLMDBMapSize compares the LMDB index's map size with the entries
	// the L3 slots can produce.
	CheckLMDBMapSize = "lmdb_map_size"
	// CheckAPISocket checks the unix socket serve will listen on (free,
	// stale or held by a live serve) and its directory.
	CheckAPISocket = "api_socket"
	// CheckPluginPins checks each plugin binary: present, executable,
	// SHA-256 as pinned.
	CheckPluginPins = "plugin_pins"
)

// Names returns the names of every check, in report order.
func Names() []string {
	return []string{CheckHugepages, CheckHugetlbfsMount, CheckMemlock, CheckODirect, CheckPLP,
		CheckDiskFree, CheckLMDBMapSize, CheckAPISocket, CheckPluginPins}
}

// Result is the outcome of one check.
type Result struct {
	// Name is one of Names().
	Name string `json:"name"`
	// Status is pass, warn or fail.
	Status Status `json:"status"`
	// Message says what was found and, unless Status is Pass, what to run
	// or change.
	Message string `json:"message"`
	// Detail holds the measured figures (bytes, pages, latencies, paths),
	// for scripts. Never nil.
	Detail map[string]any `json:"detail"`
}

// Report is the outcome of Run.
type Report struct {
	// Checks holds one Result per check, in Names() order.
	Checks []Result `json:"checks"`
	// OK is false when any check failed; warnings leave it true.
	OK bool `json:"ok"`
}

// Counts returns how many checks passed, warned and failed.
func (r Report) Counts() (pass, warn, fail int) {
	for _, c := range r.Checks {
		switch c.Status {
		case Pass:
			pass++
		case Warn:
			warn++
		default:
			fail++
		}
	}
	return pass, warn, fail
}

// check is one check: it reads st through sys and returns its Result
// (Name is filled in by Run).
type check struct {
	name string
	run  func(ctx context.Context, e *env) Result
}

// env is what every check sees.
type env struct {
	st   *config.Stack
	sys  System
	opts Options
}

// Options are what a check needs beyond the stack and the machine: the
// command-line settings of the serve the checks prepare for.
type Options struct {
	// Socket is the unix socket path kvtier serve will listen on (its
	// --socket, by default DIR/kvtier.sock under its --data-dir). Empty:
	// the socket of $.api.listen, if that names one.
	Socket string
}

func checks() []check {
	return []check{
		{CheckHugepages, checkHugepages},
		{CheckHugetlbfsMount, checkHugetlbfsMount},
		{CheckMemlock, checkMemlock},
		{CheckODirect, checkODirect},
		{CheckPLP, checkPLP},
		{CheckDiskFree, checkDiskFree},
		{CheckLMDBMapSize, checkLMDBMapSize},
		{CheckAPISocket, checkAPISocket},
		{CheckPluginPins, checkPluginPins},
	}
}

// Run runs every check against the stack st on the machine sys and
// returns the report. It never fails as a whole: a check that cannot
// measure what it needs fails itself, with the reason. A cancelled ctx
// fails the checks not yet run.
func Run(ctx context.Context, st *config.Stack, sys System) Report {
	return RunOptions(ctx, st, sys, Options{})
}

// RunOptions is Run with opts.
func RunOptions(ctx context.Context, st *config.Stack, sys System, opts Options) Report {
	rep := Report{OK: true}
	for _, c := range checks() {
		var r Result
		if err := ctx.Err(); err != nil {
			r = failf("not run: %v", err)
		} else {
			r = c.run(ctx, &env{st: st, sys: sys, opts: opts})
		}
		r.Name = c.name
		if r.Detail == nil {
			r.Detail = map[string]any{}
		}
		if r.Status == Fail {
			rep.OK = false
		}
		rep.Checks = append(rep.Checks, r)
	}
	return rep
}

func passf(format string, args ...any) Result {
	return Result{Status: Pass, Message: fmt.Sprintf(format, args...)}
}

func warnf(format string, args ...any) Result {
	return Result{Status: Warn, Message: fmt.Sprintf(format, args...)}
}

func failf(format string, args ...any) Result {
	return Result{Status: Fail, Message: fmt.Sprintf(format, args...)}
}

// with sets r's detail and returns r.
func (r Result) with(detail map[string]any) Result {
	r.Detail = detail
	return r
}

// merge combines the results of one check over several subjects (disks,
// plugins): the worst status, the messages joined in order (the failures
// and warnings first, so the actionable part leads), the details listed
// under key.
func merge(key string, parts []Result) Result {
	out := Result{Status: Pass}
	var msgs [3][]string
	details := make([]map[string]any, 0, len(parts))
	for _, p := range parts {
		out.Status = worse(out.Status, p.Status)
		msgs[2-p.Status.rank()] = append(msgs[2-p.Status.rank()], p.Message)
		if p.Detail == nil {
			p.Detail = map[string]any{}
		}
		details = append(details, p.Detail)
	}
	var all []string
	for _, m := range msgs {
		all = append(all, m...)
	}
	out.Message = strings.Join(all, "; ")
	out.Detail = map[string]any{key: details}
	return out
}

// human formats a byte count in binary units with two decimals.
func human(b int64) string {
	const unit = 1024
	if b < unit && b > -unit {
		return fmt.Sprintf("%d B", b)
	}
	f, i := float64(b), -1
	for (f >= unit || f <= -unit) && i < 4 {
		f /= unit
		i++
	}
	return fmt.Sprintf("%.2f %ciB", f, "KMGTP"[i])
}

// Package bgprio runs a tier's background work (spill copies, checksums,
// O_DIRECT writes, fsyncs) on OS threads the kernel schedules after the
// caller's: the goroutine is locked to its thread and the thread's nice
// value raised, so that when the cores are busy a serve step's goroutines
// (gRPC reader, handler, rank) run first instead of sharing a core with
// the spill at equal weight.
//
// Go schedules goroutines on Ps; a background goroutine on a low-priority
// thread still holds its P while it runs. Lowering threads therefore only
// helps when there are more Ps than the background workers need: serve
// raises GOMAXPROCS to twice CPUs.
package bgprio

import (
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Nice is the nice value of a background thread: the kernel gives a
// nice-0 thread ~70x its CPU share when both want the same core.
const Nice = 19

var (
	enabled  atomic.Bool
	warnOnce sync.Once
	lowered  atomic.Int64
	cpus     atomic.Int64 // GOMAXPROCS when Enable was called
)

// Enable turns lowering on for the process; until it is called Lower does
// nothing (tests and library users keep Go's scheduling as it is). It
// records GOMAXPROCS as the process's CPU budget (CPUs) before the caller
// raises it.
func Enable() {
	cpus.CompareAndSwap(0, int64(runtime.GOMAXPROCS(0)))
	enabled.Store(true)
}

// CPUs is the number of CPUs the process may use: GOMAXPROCS as it was
// when Enable was first called (Go's default follows the CPU affinity and
// the cgroup's quota), or GOMAXPROCS now when it was not. Size CPU-bound
// worker pools by it, not by GOMAXPROCS, which serve raises above it.
func CPUs() int {
	if n := cpus.Load(); n > 0 {
		return int(n)
	}
	return runtime.GOMAXPROCS(0)
}

// Enabled reports whether Enable was called.
func Enabled() bool { return enabled.Load() }

// Lowered is the number of goroutines running lowered now.
func Lowered() int64 { return lowered.Load() }

// Lower locks the calling goroutine to its OS thread and lowers that
// thread's priority, when Enable was called. The goroutine must call the
// returned function before it returns (defer it): the thread is then
// discarded rather than given back, niced, to other goroutines. A kernel
// that refuses is logged once and the goroutine runs as before.
func Lower() (done func()) {
	if !enabled.Load() {
		return func() {}
	}
	runtime.LockOSThread()
	if err := unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), Nice); err != nil {
		runtime.UnlockOSThread()
		warnOnce.Do(func() {
			slog.Warn("background threads keep normal priority: setpriority refused", "err", err)
		})
		return func() {}
	}
	lowered.Add(1)
	// NB: no UnlockOSThread: a goroutine that exits locked takes its
	// thread with it, so no niced thread is ever reused for a step.
	return func() { lowered.Add(-1) }
}

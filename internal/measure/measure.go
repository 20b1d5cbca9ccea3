// Package measure holds the small statistics and CPU-time readings every
// benchmark of kvtier needs: a median, and the CPU time of this process,
// of the calling thread or of another process. Rates are measured per
// CPU-second where it matters because the machines are shared: the wall
// clock also counts time spent waiting for a core, which says nothing
// about the code. It must never be imported by non-benchmark code paths.
package measure

import (
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// Median returns the median of xs (the mean of the middle two for an even
// count), 0 for none. xs is not modified.
func Median[T ~int64 | ~float64](xs []T) T {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Quantile returns the q-quantile of xs (0 < q <= 1) as the element of
// rank round(q*n) (at least the first), 0 for none. xs is not modified.
func Quantile[T ~int64 | ~float64](xs []T, q float64) T {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// ProcessCPU returns the user + system CPU time of this process so far,
// 0 if the kernel refuses to say.
func ProcessCPU() time.Duration { return rusage(unix.RUSAGE_SELF) }

// Rate runs fn until clock has advanced by at least min since the first
// call, and returns the units fn reported per second of clock (ProcessCPU,
// ThreadCPU, or a wall clock).
func Rate(clock func() time.Duration, min time.Duration, fn func() (int64, error)) (float64, error) {
	var units int64
	start := clock()
	for {
		n, err := fn()
		if err != nil {
			return 0, err
		}
		units += n
		if el := clock() - start; el >= min {
			return float64(units) / el.Seconds(), nil
		}
	}
}

// ThreadCPU returns the user + system CPU time of the calling OS thread;
// lock the goroutine to its thread around a measurement.
func ThreadCPU() time.Duration { return rusage(unix.RUSAGE_THREAD) }

func rusage(who int) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(who, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// userHZ is the clock-tick rate of /proc/<pid>/stat, fixed at 100 by the
// Linux user-space ABI whatever the kernel's HZ.
const userHZ = 100

// PidCPU returns the user + system CPU time of process pid from
// /proc/<pid>/stat (10 ms resolution), as prometheus/procfs reads it.
func PidCPU(pid int) (time.Duration, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, fmt.Errorf("cpu of pid %d: %w", pid, err)
	}
	st, err := p.Stat()
	if err != nil {
		return 0, fmt.Errorf("cpu of pid %d: %w", pid, err)
	}
	return time.Duration(st.UTime+st.STime) * time.Second / userHZ, nil
}

package bgprio

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

func TestLower(t *testing.T) {
	base := make(chan int)
	go func() { base <- threadNice() }()
	before := <-base
	for _, tc := range []struct {
		name    string
		enable  bool
		want    int
		lowered int64
	}{
		{"disabled: the thread keeps its priority", false, before, 0},
		{"enabled: the thread runs at Nice", true, Nice, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			enabled.Store(tc.enable)
			defer enabled.Store(false)
			got := make(chan [2]int64)
			fin := make(chan struct{})
			go func() {
				defer close(fin) // after done: Lowered() is back when fin closes
				done := Lower()
				defer done()
				got <- [2]int64{int64(threadNice()), Lowered()}
			}()
			g := <-got
			<-fin
			if int(g[0]) != tc.want || g[1] != tc.lowered {
				t.Fatalf("nice %d, lowered %d; want nice %d, lowered %d", g[0], g[1], tc.want, tc.lowered)
			}
		})
	}
	// A lowered goroutine's thread exits with it: goroutines started
	// afterwards never run niced.
	for range 20 {
		c := make(chan int)
		go func() { c <- threadNice() }()
		if n := <-c; n != before {
			t.Fatalf("a later goroutine runs at nice %d, want %d (a niced thread was reused)", n, before)
		}
	}
	if n := Lowered(); n != 0 {
		t.Fatalf("Lowered() = %d after every lowered goroutine returned", n)
	}
}

// threadNice returns the calling thread's nice value (-100 when getpriority fails).
func threadNice() int {
	p, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
	if err != nil {
		return -100
	}
	return 20 - p
}

// TestCPUs: the CPU budget is GOMAXPROCS as Enable found it, whatever
// GOMAXPROCS is raised to afterwards.
func TestCPUs(t *testing.T) {
	n := runtime.GOMAXPROCS(0)
	t.Cleanup(func() {
		runtime.GOMAXPROCS(n)
		enabled.Store(false)
		cpus.Store(0)
	})
	cpus.Store(0)
	if got := CPUs(); got != n {
		t.Fatalf("before Enable: CPUs() = %d, want GOMAXPROCS %d", got, n)
	}
	Enable()
	runtime.GOMAXPROCS(2 * n)
	Enable() // a second call keeps the first budget
	if got := CPUs(); got != n {
		t.Fatalf("after Enable and GOMAXPROCS %d: CPUs() = %d, want %d", 2*n, got, n)
	}
}

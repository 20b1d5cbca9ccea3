package simgroup

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/host/consensus/grouptest"
)

// TestNoDivergenceUnderRandomDelays: 8 ranks × 10k ticks, every rank
// delayed at random at every tick, every frontier the reference.
func TestNoDivergenceUnderRandomDelays(t *testing.T) {
	ticks := 10000
	if testing.Short() {
		ticks = 1000
	}
	for _, seed := range []uint64{1} {
		g, err := New(8, Options{Seed: seed, MaxDelay: 20 * time.Microsecond, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := grouptest.Lockstep(context.Background(), grouptest.AsGroups(g.Members()), ticks, seed); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}

func run(g *Group, tick uint64) ([]consensus.Frontier, []error) {
	fs, errs, _ := runTimed(g, tick)
	return fs, errs
}

// runTimed runs tick on every rank and also returns how long each took.
func runTimed(g *Group, tick uint64) ([]consensus.Frontier, []error, []time.Duration) {
	ms := g.Members()
	fs, errs, took := make([]consensus.Frontier, len(ms)), make([]error, len(ms)), make([]time.Duration, len(ms))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := consensus.NewContribution(tick, consensus.Shape{Classes: 1, OKBits: 4})
			start := time.Now()
			fs[r], errs[r] = m.Exchange(ctx, tick, c)
			took[r] = time.Since(start)
		}()
	}
	wg.Wait()
	return fs, errs, took
}

func TestFaults(t *testing.T) {
	const timeout = 100 * time.Millisecond
	for _, tc := range []struct {
		name  string
		fault Fault
		check func(t *testing.T, fs []consensus.Frontier, errs []error)
	}{
		{"failed op is failed on every rank", Fault{Rank: 3, Tick: 2, Kind: FailOp, Bit: 1}, func(t *testing.T, fs []consensus.Frontier, errs []error) {
			for r := range fs {
				if errs[r] != nil || fs[r].OK[1] || !fs[r].OK[0] {
					t.Errorf("rank %d: %v %v, want bit 1 failed and bit 0 ok", r, errs[r], fs[r].OK)
				}
			}
		}},
		{"stalled rank named", Fault{Rank: 5, Tick: 2, Kind: Stall}, func(t *testing.T, fs []consensus.Frontier, errs []error) {
			for r, err := range errs {
				if r != 5 && (!errors.Is(err, consensus.ErrTimeout) || !strings.Contains(err.Error(), "rank 5 at tick 2")) {
					t.Errorf("rank %d: got %v, want a timeout naming rank 5 at tick 2", r, err)
				}
			}
		}},
		{"crashed rank named", Fault{Rank: 0, Tick: 2, Kind: Crash}, func(t *testing.T, fs []consensus.Frontier, errs []error) {
			if !errors.Is(errs[0], ErrCrashed) {
				t.Errorf("rank 0: got %v", errs[0])
			}
			for r, err := range errs[1:] {
				if !strings.Contains(err.Error(), "rank 0 at tick 2") {
					t.Errorf("rank %d: got %v, want an error naming rank 0 at tick 2", r+1, err)
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := New(8, Options{Seed: 3, Faults: []Fault{tc.fault}, Timeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			if _, errs := run(g, 1); errors.Join(errs...) != nil {
				t.Fatal(errors.Join(errs...))
			}
			fs, errs, took := runTimed(g, 2)
			for r, el := range took {
				if r != tc.fault.Rank && el > 20*timeout {
					t.Errorf("rank %d: tick took %v with a %v deadline", r, el, timeout)
				}
			}
			tc.check(t, fs, errs)
		})
	}
}

// TestProbeNeverExchanges: the seed's Gloo 4-vs-2 abort. An exchange from
// inside a probe is refused on the calling rank and does not count as its
// contribution; the tick that follows still completes on every rank.
func TestProbeNeverExchanges(t *testing.T) {
	g, _ := New(4, Options{Seed: 9, Timeout: time.Second})
	var err error
	g.Probe(func() {
		_, err = g.Members()[2].Exchange(context.Background(), 1, consensus.NewContribution(1, consensus.Shape{}))
	})
	if !errors.Is(err, consensus.ErrProbe) || !strings.Contains(err.Error(), "rank 2 at tick 1") {
		t.Fatalf("got %v, want ErrProbe naming rank 2 at tick 1", err)
	}
	if _, errs := run(g, 1); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
}

// TestRankWithNothingToDrainTakesPart: the seed's NCCL deadlock. A rank
// whose contribution is all zero (nothing finished) still exchanges; the
// frontier is then zero for everyone and nobody hangs.
func TestRankWithNothingToDrainTakesPart(t *testing.T) {
	g, _ := New(4, Options{Seed: 4, MaxDelay: 50 * time.Microsecond, Timeout: time.Second})
	ms := g.Members()
	s := consensus.Shape{Classes: 2}
	fs := make([]consensus.Frontier, len(ms))
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for r, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := consensus.NewContribution(1, s)
			if r != 1 {
				c.Counts[0].Durable = 7
			}
			fs[r], errs[r] = m.Exchange(context.Background(), 1, c)
		}()
	}
	wg.Wait()
	for r := range ms {
		if errs[r] != nil || fs[r].Counts[0].Durable != 0 {
			t.Errorf("rank %d: %v %+v, want durable 0", r, errs[r], fs[r].Counts)
		}
	}
}

// TestFailedOpsNeverDiverge: 8 ranks × 3,000 ticks with random delays and
// 1% of every rank's operations failing at random: every rank applies the
// same frontier at every tick, and an op that failed on any rank is
// failed in it.
func TestFailedOpsNeverDiverge(t *testing.T) {
	const size, ticks, seed = 8, 3000, 21
	g, err := New(size, Options{Seed: seed, MaxDelay: 10 * time.Microsecond, OpFailRate: 0.01, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	got := make([][]consensus.Frontier, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r, m := range g.Members() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for tk := uint64(1); tk <= ticks; tk++ {
				f, err := m.Exchange(context.Background(), tk, grouptest.ContributionAt(seed, r, tk))
				if err != nil {
					errs[r] = err
					return
				}
				got[r] = append(got[r], f)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	var failed uint64
	for _, m := range g.Members() {
		failed += m.FailedOps()
	}
	if failed == 0 {
		t.Fatalf("seed %d: no operation failed; the test tests nothing", seed)
	}
	for tk := range ticks {
		for r := 1; r < size; r++ {
			if !got[r][tk].Equal(got[0][tk]) {
				t.Fatalf("seed %d: tick %d: rank %d applied %+v, rank 0 %+v", seed, tk+1, r, got[r][tk], got[0][tk])
			}
		}
		cs := make([]consensus.Contribution, size)
		for r := range cs {
			cs[r] = grouptest.ContributionAt(seed, r, uint64(tk+1))
		}
		want, _ := consensus.Reduce(uint64(tk+1), cs)
		for i, ok := range got[0][tk].OK {
			if ok && !want.OK[i] {
				t.Fatalf("seed %d: tick %d: bit %d ok in the frontier, failed on some rank", seed, tk+1, i)
			}
		}
	}
	t.Logf("%d ops failed by injection over %d ticks, no divergence", failed, ticks)
}

package measure

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// TestPidCPU reads this process's CPU time from /proc and refuses a pid
// that does not exist.
func TestPidCPU(t *testing.T) {
	if _, err := PidCPU(os.Getpid()); err != nil {
		t.Fatalf("own stat: %v", err)
	}
	if _, err := PidCPU(1 << 30); err == nil || !strings.Contains(err.Error(), "cpu of pid") {
		t.Fatalf("a pid beyond pid_max: %v", err)
	}
	if ProcessCPU() <= 0 {
		t.Fatal("no CPU time for this process")
	}
}

func TestMedianAndQuantile(t *testing.T) {
	cases := []struct {
		xs       []float64
		median   float64
		quantile float64 // q = 0.99
	}{
		{nil, 0, 0},
		{[]float64{3}, 3, 3},
		{[]float64{4, 1, 3, 2}, 2.5, 4},
		{[]float64{5, 1, 4, 2, 3}, 3, 5},
	}
	for _, c := range cases {
		in := append([]float64(nil), c.xs...)
		if got := Median(c.xs); got != c.median {
			t.Errorf("Median(%v) = %v, want %v", c.xs, got, c.median)
		}
		if got := Quantile(c.xs, 0.99); got != c.quantile {
			t.Errorf("Quantile(%v, 0.99) = %v, want %v", c.xs, got, c.quantile)
		}
		for i := range in {
			if in[i] != c.xs[i] {
				t.Fatalf("input reordered: %v", c.xs)
			}
		}
	}
	ds := []time.Duration{3, 1, 2, 4}
	if got := Quantile(ds, 0.5); got != 2 {
		t.Errorf("Quantile(durations, 0.5) = %v, want 2 (the lower middle)", got)
	}
	if ThreadCPU() < 0 {
		t.Error("negative thread CPU time")
	}
}

func TestQuantileRanks(t *testing.T) {
	ds := []int{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	in := make([]int64, len(ds))
	for i, d := range ds {
		in[i] = int64(d)
	}
	cases := []struct {
		q    float64
		want int64
	}{{0.5, 5}, {0.99, 10}, {0.1, 1}, {0, 1}, {1, 10}}
	for _, c := range cases {
		durs := make([]time.Duration, len(in))
		for i, v := range in {
			durs[i] = time.Duration(v)
		}
		if got := Quantile(durs, c.q); int64(got) != c.want {
			t.Errorf("Quantile(%v) = %d, want %d", c.q, got, c.want)
		}
	}
	if Quantile([]time.Duration(nil), 0.5) != 0 {
		t.Error("quantile of nothing is not 0")
	}
}

// TestRate: Rate calls fn until the clock advanced by min and divides the
// units by the clock's advance; an error stops it.
func TestRate(t *testing.T) {
	now := time.Duration(0)
	clock := func() time.Duration { return now }
	calls := 0
	r, err := Rate(clock, 3*time.Second, func() (int64, error) {
		calls++
		now += time.Second
		return 10, nil
	})
	if err != nil || calls != 3 || r != 10 {
		t.Fatalf("Rate = %v, %v after %d calls; want 10 units/s after 3", r, err, calls)
	}
	boom := errors.New("boom")
	if _, err := Rate(clock, time.Second, func() (int64, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Fatalf("Rate with a failing fn: %v", err)
	}
}

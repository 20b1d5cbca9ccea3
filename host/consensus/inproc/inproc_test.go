package inproc

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

func TestLockstep(t *testing.T) {
	ms, err := New(8, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	if err := grouptest.Lockstep(context.Background(), grouptest.AsGroups(ms), 2000, 7); err != nil {
		t.Fatal(err)
	}
}

func TestNewRefuses(t *testing.T) {
	for _, n := range []int{0, -1, consensus.MaxGroupSize + 1} {
		if _, err := New(n, DefaultOptions()); err == nil {
			t.Errorf("size %d accepted", n)
		}
	}
	if _, err := New(2, Options{}); err == nil {
		t.Error("zero timeout accepted")
	}
}

// exchangeAll runs tick on every rank but skip and returns their errors.
func exchangeAll(ms []*Member, tick uint64, skip int, mut func(r int, c *consensus.Contribution)) []error {
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for r, m := range ms {
		if r == skip {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := grouptest.ContributionAt(1, r, tick)
			if mut != nil {
				mut(r, &c)
			}
			_, errs[r] = m.Exchange(context.Background(), tick, c)
		}()
	}
	wg.Wait()
	return errs
}

func TestStalledRankNamedWithinDeadline(t *testing.T) {
	const timeout = 100 * time.Millisecond
	ms, _ := New(4, Options{Timeout: timeout})
	start := time.Now()
	errs := exchangeAll(ms, 1, 2, nil)
	if el := time.Since(start); el > 20*timeout {
		t.Errorf("took %v with a %v deadline", el, timeout)
	}
	for r, err := range errs {
		if r == 2 {
			continue
		}
		if !errors.Is(err, consensus.ErrTimeout) || !strings.Contains(err.Error(), "rank 2 at tick 1") {
			t.Errorf("rank %d: got %v, want a timeout naming rank 2 at tick 1", r, err)
		}
	}
	if _, err := ms[2].Exchange(context.Background(), 1, grouptest.ContributionAt(1, 2, 1)); !errors.Is(err, consensus.ErrStopped) {
		t.Errorf("the late rank: got %v, want ErrStopped", err)
	}
	if ms[0].Err() == nil {
		t.Error("a stopped group reports healthy")
	}
}

func TestDigestMismatchOnEveryRank(t *testing.T) {
	ms, _ := New(3, DefaultOptions())
	errs := exchangeAll(ms, 16, -1, func(r int, c *consensus.Contribution) {
		if r == 1 {
			c.Structures[consensus.StructQueues][3] ^= 1
			c.Digest[3] ^= 1
		}
	})
	for r, err := range errs {
		var me *consensus.MismatchError
		if !errors.As(err, &me) || me.Structure != consensus.StructQueues || me.RankB != 1 || me.Tick != 16 {
			t.Errorf("rank %d: got %v, want a mismatch on queues naming rank 1 at tick 16", r, err)
		}
	}
}

func TestRanksAtDifferentTicksStop(t *testing.T) {
	ms, _ := New(2, Options{Timeout: time.Second})
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := uint64(3 + r)
			_, errs[r] = m.Exchange(context.Background(), tick, grouptest.ContributionAt(1, r, tick))
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, consensus.ErrTick) {
			t.Errorf("rank %d: got %v, want ErrTick", r, err)
		}
	}
}

func TestTicksMustIncrease(t *testing.T) {
	ms, _ := New(1, DefaultOptions())
	if _, err := ms[0].Exchange(context.Background(), 5, grouptest.ContributionAt(1, 0, 5)); err != nil {
		t.Fatal(err)
	}
	if _, err := ms[0].Exchange(context.Background(), 5, grouptest.ContributionAt(1, 0, 5)); !errors.Is(err, consensus.ErrTick) {
		t.Errorf("a replayed tick: got %v, want ErrTick", err)
	}
}

// TestCanceledExchangeSaysWhy: a rank whose exchange's context ends gets
// the context's cause (a plain cancel: context.Canceled), naming the rank
// and tick.
func TestCanceledExchangeSaysWhy(t *testing.T) {
	why := errors.New("rank 1's session ended (closed)")
	for _, tc := range []struct {
		name   string
		cancel func(context.CancelCauseFunc)
		want   error
	}{
		{"cause", func(c context.CancelCauseFunc) { c(why) }, why},
		{"plain", func(c context.CancelCauseFunc) { c(nil) }, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms, err := New(2, DefaultOptions())
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancelCause(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := ms[0].Exchange(ctx, 1, grouptest.ContributionAt(1, 0, 1))
				done <- err
			}()
			tc.cancel(cancel)
			err = <-done
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), "rank 0 at tick 1") {
				t.Fatalf("got %v, want %v naming rank 0 at tick 1", err, tc.want)
			}
		})
	}
}

package enginegroup

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/host/consensus/grouptest"
)

// engine plays the engine: it waits for every rank's pending contribution,
// reduces them (its all-reduce) and delivers the frontier to each, with
// mut applied to the frontier delivered to rank bad.
func engine(t *testing.T, ms []*Member, tick uint64, bad int, mut func(*consensus.Frontier)) []error {
	t.Helper()
	cs := make([]consensus.Contribution, len(ms))
	for r, m := range ms {
		deadline := time.Now().Add(5 * time.Second)
		for {
			c, ok := m.Pending()
			if ok && c.Tick == tick {
				cs[r] = c
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("rank %d never published tick %d", r, tick)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	f, err := consensus.Reduce(tick, cs)
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]error, len(ms))
	for r, m := range ms {
		g := f.Clone()
		if r == bad {
			mut(&g)
		}
		errs[r] = m.Deliver(g)
	}
	return errs
}

func TestEngineRoundTrip(t *testing.T) {
	const size, ticks = 4, 200
	ms := make([]*Member, size)
	for r := range ms {
		ms[r], _ = New(r, size, 1, 2)
	}
	done := make(chan error, 1)
	go func() { done <- grouptest.Lockstep(context.Background(), grouptest.AsGroups(ms), ticks, 5) }()
	for tick := uint64(1); tick <= ticks; tick++ {
		if err := errors.Join(engine(t, ms, tick, -1, nil)...); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestEngineFrontierChecked(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*consensus.Frontier)
		want error
	}{
		{"wrong shape", func(f *consensus.Frontier) { f.Shape.Classes++; f.Counts = append(f.Counts, consensus.Counts{}) }, consensus.ErrShape},
		{"wrong tick", func(f *consensus.Frontier) { f.Tick++ }, consensus.ErrTick},
		{"counter above the rank's", func(f *consensus.Frontier) { f.Counts[0].Durable += 100 }, consensus.ErrShape},
		{"other digest", func(f *consensus.Frontier) { f.Digest[0] ^= 1 }, consensus.ErrDigestMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := make([]*Member, 2)
			for r := range ms {
				ms[r], _ = New(r, 2, 1, 2)
			}
			errs := make(chan error, 2)
			for r, m := range ms {
				go func() {
					_, err := m.Exchange(context.Background(), 16, grouptest.ContributionAt(3, r, 16))
					errs <- err
				}()
			}
			derrs := engine(t, ms, 16, 1, tc.mut)
			if derrs[0] != nil || !errors.Is(derrs[1], tc.want) {
				t.Errorf("deliver: got %v, want nil and %v", derrs, tc.want)
			}
			got := []error{<-errs, <-errs}
			if (got[0] == nil) == (got[1] == nil) {
				t.Errorf("exchange errors %v: want exactly rank 1's", got)
			}
			if _, err := ms[1].Exchange(context.Background(), 17, grouptest.ContributionAt(3, 1, 17)); !errors.Is(err, consensus.ErrStopped) {
				t.Errorf("after a bad frontier: got %v, want ErrStopped", err)
			}
		})
	}
}

func TestDeliverWithoutExchange(t *testing.T) {
	m, _ := New(0, 1, 1, 2)
	if err := m.Deliver(consensus.Frontier{Tick: 3}); !errors.Is(err, ErrNoExchange) {
		t.Errorf("got %v, want ErrNoExchange", err)
	}
	if _, err := New(2, 2, 0, 0); err == nil {
		t.Error("rank 2 of 2 accepted")
	}
}

func TestDeliverEncodedRefusesForeign(t *testing.T) {
	m, _ := New(0, 1, 1, 2)
	errc := make(chan error, 1)
	go func() {
		_, err := m.Exchange(context.Background(), 1, grouptest.ContributionAt(1, 0, 1))
		errc <- err
	}()
	for {
		if _, ok := m.Pending(); ok {
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	c, _ := m.Pending()
	b, _ := consensus.AppendFrontier(nil, consensus.Envelope{Group: 9, Stack: 2, Size: 1}, consensus.Frontier(c))
	if err := m.DeliverEncoded(b); !errors.Is(err, consensus.ErrForeign) {
		t.Errorf("got %v, want ErrForeign", err)
	}
	if err := <-errc; !errors.Is(err, consensus.ErrForeign) {
		t.Errorf("exchange: got %v, want ErrForeign", err)
	}
}

// Package grouptest holds the checks every consensus.Group transport must
// pass, run by each transport's tests: ranks in lockstep never diverge
// (every rank gets the reference frontier at every tick). It is for tests
// only and must never be imported by production code.
package grouptest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/kvtier/kvtier/host/consensus"
)

// ShapeAt is the shape of tick: a function of the tick alone, as a real
// shape is a function of replicated state. Every 16th tick carries
// digests with per-structure ones.
func ShapeAt(tick uint64) consensus.Shape {
	s := consensus.Shape{Classes: 2, OKBits: int(tick % 9), Reloads: int(tick % 4)}
	if tick%16 == 0 {
		s.Digest, s.Structures = true, int(consensus.NumStructures)
	}
	return s
}

// ContributionAt is rank's contribution at tick under seed: deterministic,
// so a checker can rebuild every rank's.
func ContributionAt(seed uint64, rank int, tick uint64) consensus.Contribution {
	rng := rand.New(rand.NewPCG(seed^tick*0x9e3779b97f4a7c15, uint64(rank)))
	return consensus.RandomContribution(rng, tick, ShapeAt(tick), consensus.Digest{byte(tick), byte(tick >> 8), 0x5a})
}

// Lockstep runs every member for ticks 1..ticks, each in its own
// goroutine, and checks that every rank got, at every tick, the reference
// frontier of all ranks' ContributionAt. It returns the first error (an
// exchange error or a divergence), naming seed, rank and tick.
func Lockstep(ctx context.Context, members []consensus.Group, ticks int, seed uint64) error {
	size := len(members)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r, m := range members {
		if m.Rank() != r || m.Size() != size {
			return fmt.Errorf("grouptest: member %d is rank %d of %d, want rank %d of %d", r, m.Rank(), m.Size(), r, size)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs := make([]consensus.Contribution, size)
			for t := uint64(1); t <= uint64(ticks); t++ {
				f, err := m.Exchange(ctx, t, ContributionAt(seed, r, t))
				if err != nil {
					errs[r] = fmt.Errorf("grouptest seed %d: rank %d tick %d: %w", seed, r, t, err)
					return
				}
				for q := range cs {
					cs[q] = ContributionAt(seed, q, t)
				}
				want, err := consensus.Reduce(t, cs)
				if err != nil {
					errs[r] = fmt.Errorf("grouptest seed %d: reference at tick %d: %w", seed, t, err)
					return
				}
				if !f.Equal(want) {
					errs[r] = fmt.Errorf("grouptest seed %d: rank %d tick %d diverged: got %+v, want %+v", seed, r, t, f, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// AsGroups converts a slice of a transport's members to consensus.Group.
func AsGroups[M consensus.Group](ms []M) []consensus.Group {
	gs := make([]consensus.Group, len(ms))
	for i, m := range ms {
		gs[i] = m
	}
	return gs
}

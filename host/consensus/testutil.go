package consensus

import "math/rand/v2"

// RandomContribution returns a contribution of shape s at tick whose
// counters, ok bits and prefixes are drawn from rng, for tests and
// benchmarks of every transport. Digests are left as given by digest.
func RandomContribution(rng *rand.Rand, tick uint64, s Shape, digest Digest) Contribution {
	c := NewContribution(tick, s)
	base := tick * 4
	for i := range c.Counts {
		c.Counts[i] = Counts{
			Gathered: base + rng.Uint64N(4), Durable: base + rng.Uint64N(4),
			Reloaded: base + rng.Uint64N(4), L1Copied: base + rng.Uint64N(4),
		}
	}
	for i := range c.OK {
		c.OK[i] = rng.IntN(16) != 0
	}
	for i := range c.Prefix {
		c.Prefix[i] = rng.Uint32N(64)
	}
	if s.Digest {
		c.Digest = digest
		for i := range c.Structures {
			c.Structures[i] = digest
			c.Structures[i][0] ^= byte(i + 1)
		}
	}
	return c
}

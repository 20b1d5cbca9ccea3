package l2hugetlb

import (
	"context"
	"fmt"

	"github.com/kvtier/kvtier/registry"
	"github.com/kvtier/kvtier/tiers"
)

// Name is the module's name in a stack config (use: l2hugetlb).
const Name = "l2hugetlb"

// Register adds the l2hugetlb slab to r (role kvtier.tier.slab.v1).
func Register(r *tiers.Registry) error {
	return r.Slabs.Register(registry.Registration[tiers.Factory[tiers.Slab]]{
		Type:      tiers.SlabV1,
		Name:      Name,
		Doc:       "shared L2 slab files on hugetlbfs (2 MiB pages), with an explicit shm fallback",
		NewConfig: registry.NewConfigOf(DefaultConfig),
		Factory: func(ctx context.Context, env tiers.Env, cfg any) (tiers.Slab, error) {
			c, err := registry.ConfigAs(Name, cfg, DefaultConfig)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", err, tiers.ErrInvalid)
			}
			// NB: a failed open must return a nil interface, not one
			// holding a nil pointer.
			m, err := Open(ctx, env, c)
			if err != nil {
				return nil, err
			}
			return m, nil
		},
	})
}

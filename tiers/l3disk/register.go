package l3disk

import (
	"context"
	"fmt"

	"github.com/kvtier/kvtier/registry"
	"github.com/kvtier/kvtier/tiers"
)

// Name is the module name stacks select the disk store by.
const Name = "l3disk"

// Register adds the disk store to r as kvtier.tier.store.v1/l3disk.
func Register(r *tiers.Registry) error {
	return r.Stores.Register(registry.Registration[tiers.Factory[tiers.Store]]{
		Type:      tiers.StoreV1,
		Name:      Name,
		Doc:       "O_DIRECT slot store on local disks, located through an index (lmdb or badger)",
		NewConfig: registry.NewConfigOf(DefaultConfig),
		Factory: func(ctx context.Context, env tiers.Env, cfg any) (tiers.Store, error) {
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

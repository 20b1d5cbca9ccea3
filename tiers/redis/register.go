package redis

import (
	"context"
	"fmt"

	"github.com/kvtier/kvtier/registry"
	"github.com/kvtier/kvtier/tiers"
)

// Name is the module name stacks select the Redis store by.
const Name = "redis"

// Register adds the Redis store to r as kvtier.tier.store.v1/redis.
func Register(r *tiers.Registry) error {
	return r.Stores.Register(registry.Registration[tiers.Factory[tiers.Store]]{
		Type:      tiers.StoreV1,
		Name:      Name,
		Doc:       "pages in Redis Cluster or a standalone Redis, one verified key per page payload; the server's maxmemory-policy evicts",
		NewConfig: registry.NewConfigOf(DefaultConfig),
		Factory: func(ctx context.Context, env tiers.Env, cfg any) (tiers.Store, error) {
			c, err := registry.ConfigAs(Name, cfg, DefaultConfig)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", err, tiers.ErrInvalid)
			}
			st, err := Open(ctx, env, c)
			if err != nil {
				// NB: a nil *Store in a tiers.Store would not be == nil.
				return nil, err
			}
			return st, nil
		},
	})
}

package l1cuda

import (
	"context"
	"fmt"

	"github.com/kvtier/kvtier/registry"
	"github.com/kvtier/kvtier/tiers"
)

// Register adds the host, engine and cuda pools to r as Pool v1 modules.
func Register(r *tiers.Registry) error {
	regs := []registry.Registration[tiers.Factory[tiers.Pool]]{
		{
			Type: tiers.PoolV1, Name: "host",
			Doc:       "pages in host memory, layer-first, copied with streaming stores (no GPU; tests and CPU engines)",
			NewConfig: registry.NewConfigOf(DefaultHostConfig),
			Factory: func(ctx context.Context, env tiers.Env, cfg any) (tiers.Pool, error) {
				c, err := registry.ConfigAs("host", cfg, DefaultHostConfig)
				if err != nil {
					return nil, fmt.Errorf("%w: %w", err, tiers.ErrInvalid)
				}
				return OpenHost(env, c)
			},
		},
		{
			Type: tiers.PoolV1, Name: "engine",
			Doc:       "the engine runs the copies kvtier plans and reports them back (no CUDA in kvtier)",
			NewConfig: registry.NewConfigOf(DefaultEngineConfig),
			Factory: func(ctx context.Context, env tiers.Env, cfg any) (tiers.Pool, error) {
				c, err := registry.ConfigAs("engine", cfg, DefaultEngineConfig)
				if err != nil {
					return nil, fmt.Errorf("%w: %w", err, tiers.ErrInvalid)
				}
				return OpenEngine(env, c)
			},
		},
		{
			Type: tiers.PoolV1, Name: "cuda",
			Doc:       "GPU pages through libcudart loaded at run time: pinned slab, IPC-opened KV pool, stream copies fenced by events",
			NewConfig: registry.NewConfigOf(DefaultCUDAConfig),
			Factory: func(ctx context.Context, env tiers.Env, cfg any) (tiers.Pool, error) {
				c, err := registry.ConfigAs("cuda", cfg, DefaultCUDAConfig)
				if err != nil {
					return nil, fmt.Errorf("%w: %w", err, tiers.ErrInvalid)
				}
				return OpenCUDA(env, c)
			},
		},
	}
	for _, reg := range regs {
		if err := r.Pools.Register(reg); err != nil {
			return fmt.Errorf("l1cuda: %w", err)
		}
	}
	return nil
}

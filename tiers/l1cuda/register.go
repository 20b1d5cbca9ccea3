package l1cuda

import (
	"context"
	"fmt"

	"github.com/kvtier/kvtier/registry"
	"github.com/kvtier/kvtier/tiers"
)

// Register adds the host, engine and cuda pools to r as Pool v1 modules.
func Register(r *tiers.Registry) error {
	for _, reg := range []registry.Registration[tiers.Factory[tiers.Pool]]{
		poolRegistration("host", "pages in host memory, layer-first, copied with streaming stores (no GPU; tests and CPU engines)",
			DefaultHostConfig, func(env tiers.Env, c HostConfig) (tiers.Pool, error) { return asPool(OpenHost(env, c)) }),
		poolRegistration("engine", "the engine runs the copies kvtier plans and reports them back (no CUDA in kvtier)",
			DefaultEngineConfig, func(env tiers.Env, c EngineConfig) (tiers.Pool, error) { return asPool(OpenEngine(env, c)) }),
		poolRegistration("cuda", "GPU pages through libcudart loaded at run time: pinned slab, IPC-opened KV pool, stream copies fenced by events",
			DefaultCUDAConfig, func(env tiers.Env, c CUDAConfig) (tiers.Pool, error) { return asPool(OpenCUDA(env, c)) }),
	} {
		if err := r.Pools.Register(reg); err != nil {
			return fmt.Errorf("l1cuda: %w", err)
		}
	}
	return nil
}

// poolRegistration is the registry entry of one pool whose config C has
// the given defaults.
func poolRegistration[C any](name, doc string, defaults func() C, open func(tiers.Env, C) (tiers.Pool, error)) registry.Registration[tiers.Factory[tiers.Pool]] {
	return registry.Registration[tiers.Factory[tiers.Pool]]{
		Type: tiers.PoolV1, Name: name, Doc: doc,
		NewConfig: registry.NewConfigOf(defaults),
		Factory: func(ctx context.Context, env tiers.Env, cfg any) (tiers.Pool, error) {
			c, err := registry.ConfigAs(name, cfg, defaults)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", err, tiers.ErrInvalid)
			}
			return open(env, c)
		},
	}
}

// asPool returns a failed open as a nil interface, not as an interface
// holding a nil pointer.
func asPool[P tiers.Pool](p P, err error) (tiers.Pool, error) {
	if err != nil {
		return nil, err
	}
	return p, nil
}

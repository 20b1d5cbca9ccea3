package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/plugins/pluginhost"
	"github.com/kvtier/kvtier/tiers"
)

// Registries are the module registries a stack is opened from.
type Registries struct {
	Tiers   *tiers.Registry
	Indexes *indexes.Registry
}

// Options are what the process that opens a stack decides, beside the
// config: where logs and metrics go, the stack's identity, the cold start
// mode of the stores, and the plugin host's settings.
type Options struct {
	// Logger receives every tier's logs; nil discards them.
	Logger *slog.Logger
	// Registerer receives every tier's metrics; nil registers none.
	Registerer prometheus.Registerer
	// StackID names the stack (slab locks, plugin handshakes); required.
	StackID string
	// ColdStart is what stores do with data a previous run left.
	ColdStart tiers.ColdStart
	// IndexDir is where an index whose config names no directory keeps
	// its files: IndexDir/<tier name>. Empty: such an index refuses.
	IndexDir string
	// Plugins configures the plugin host for tiers and indexes served by
	// plugin binaries.
	Plugins pluginhost.Options
}

// Store is one opened store tier and, when its entry names one, the
// index it owns.
type Store struct {
	// Name is the tier's name in the config.
	Name string
	// Store is the opened tier.
	Store tiers.Store
	// Index is the store's opened index, or nil.
	Index indexes.Index
}

// Stack is an opened tier stack: one slab, an optional L1 pool, and the
// stores below the slab from top to bottom.
type Stack struct {
	// Config is the stack config the stack was opened from.
	Config *config.Stack
	// Slab is the L2 hub every other tier copies through.
	Slab tiers.Slab
	// Pool is the L1 pool, or nil when the config has none.
	Pool tiers.Pool
	// PoolName is the pool tier's name in the config.
	PoolName string
	// Stores are the store tiers in config order.
	Stores []Store

	closers []closer // in opening order; Close runs them backwards
}

type closer struct {
	what  string
	close func() error
}

// Open opens st's tiers in dependency order: the slab first (every other
// tier copies through it), then each store's index and the store, then
// the pool. If a step fails, what was opened is closed in reverse order
// and the error names the tier that failed.
func Open(ctx context.Context, st *config.Stack, regs Registries, opts Options) (_ *Stack, err error) {
	if st == nil {
		return nil, fmt.Errorf("open stack: no config")
	}
	if regs.Tiers == nil || regs.Indexes == nil {
		return nil, fmt.Errorf("open stack: tier and index registries are required")
	}
	if opts.StackID == "" {
		return nil, fmt.Errorf("open stack: no stack id")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Stack{Config: st}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.Close())
		}
	}()
	env := tiers.Env{
		Logger: opts.Logger, Registerer: opts.Registerer, Payload: st.Payload,
		Rank: st.Ranks.Rank, WorldSize: st.Ranks.WorldSize, StackID: opts.StackID,
		ColdStart: opts.ColdStart,
	}
	// The slab first: pools and stores move pages through it.
	for _, t := range st.Tiers {
		if t.Role != config.RoleSlab {
			continue
		}
		if s.Slab != nil {
			return nil, fmt.Errorf("open stack: tier %q: a second slab (the stack has one L2 hub)", t.Name)
		}
		reg, err := regs.Tiers.Slabs.Lookup(tiers.SlabV1, t.Use)
		if err != nil {
			return nil, fmt.Errorf("open stack: tier %q: %w", t.Name, err)
		}
		slab, err := reg.Factory(ctx, env, t.Config)
		if err != nil {
			return nil, fmt.Errorf("open stack: slab tier %q (%s): %w", t.Name, reg.FullID(), err)
		}
		s.Slab = slab
		s.closers = append(s.closers, closer{"slab " + t.Name, slab.Close})
	}
	if s.Slab == nil {
		return nil, fmt.Errorf("open stack: no slab tier (pools and stores need one)")
	}
	env.Slab = s.Slab
	for _, t := range st.Tiers {
		if t.Role != config.RoleStore {
			continue
		}
		if err := s.openStore(ctx, t, regs, env, opts); err != nil {
			return nil, err
		}
	}
	for _, t := range st.Tiers {
		if t.Role != config.RolePool {
			continue
		}
		if s.Pool != nil {
			return nil, fmt.Errorf("open stack: tier %q: a second pool (the stack has one L1)", t.Name)
		}
		reg, err := regs.Tiers.Pools.Lookup(tiers.PoolV1, t.Use)
		if err != nil {
			return nil, fmt.Errorf("open stack: tier %q: %w", t.Name, err)
		}
		pool, err := reg.Factory(ctx, env, t.Config)
		if err != nil {
			return nil, fmt.Errorf("open stack: pool tier %q (%s): %w", t.Name, reg.FullID(), err)
		}
		s.Pool, s.PoolName = pool, t.Name
		s.closers = append(s.closers, closer{"pool " + t.Name, pool.Close})
	}
	return s, nil
}

// openStore opens one store tier, its index first when it names one.
func (s *Stack) openStore(ctx context.Context, t config.Tier, regs Registries, env tiers.Env, opts Options) error {
	if t.Index != nil {
		ix, err := openIndex(ctx, t, regs, opts)
		if err != nil {
			return err
		}
		s.closers = append(s.closers, closer{"index of " + t.Name, ix.Close})
		env.Index = ix
	}
	var st tiers.Store
	if t.Plugin != nil {
		p, err := pluginhost.OpenStore(ctx, env, FromConfig(t.Name, *t.Plugin, opts.Plugins))
		if err != nil {
			return fmt.Errorf("open stack: store tier %q (plugin %s): %w", t.Name, t.Plugin.Path, err)
		}
		st = p
	} else {
		reg, err := regs.Tiers.Stores.Lookup(tiers.StoreV1, t.Use)
		if err != nil {
			return fmt.Errorf("open stack: tier %q: %w", t.Name, err)
		}
		if st, err = reg.Factory(ctx, env, t.Config); err != nil {
			return fmt.Errorf("open stack: store tier %q (%s): %w", t.Name, reg.FullID(), err)
		}
	}
	s.closers = append(s.closers, closer{"store " + t.Name, st.Close})
	s.Stores = append(s.Stores, Store{Name: t.Name, Store: st, Index: env.Index})
	return nil
}

// openIndex opens the index a store tier names, in process or as a
// plugin.
func openIndex(ctx context.Context, t config.Tier, regs Registries, opts Options) (indexes.Index, error) {
	env := indexes.Env{Logger: opts.Logger, Registerer: opts.Registerer}
	if opts.IndexDir != "" {
		env.Dir = filepath.Join(opts.IndexDir, t.Name)
	}
	if t.Index.Plugin != nil {
		ix, err := pluginhost.OpenIndex(ctx, env, FromConfig(t.Name+"-index", *t.Index.Plugin, opts.Plugins))
		if err != nil {
			return nil, fmt.Errorf("open stack: index of tier %q (plugin %s): %w", t.Name, t.Index.Plugin.Path, err)
		}
		return ix, nil
	}
	reg, err := regs.Indexes.Lookup(indexes.IndexV1, t.Index.Use)
	if err != nil {
		return nil, fmt.Errorf("open stack: index of tier %q: %w", t.Name, err)
	}
	ix, err := reg.Factory(ctx, env, t.Index.Config)
	if err != nil {
		return nil, fmt.Errorf("open stack: index of tier %q (%s): %w", t.Name, reg.FullID(), err)
	}
	return ix, nil
}

// Close closes the tiers in the reverse of their opening order (the pool,
// then each store before its index, the slab last) and joins every error.
// It is safe to call twice.
func (s *Stack) Close() error {
	var errs []error
	for i := len(s.closers) - 1; i >= 0; i-- {
		if err := s.closers[i].close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", s.closers[i].what, err))
		}
	}
	s.closers = nil
	return errors.Join(errs...)
}

package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"

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
	// Shared, when set, lets the stacks opened with it (the ranks of one
	// process) share an in-process index their configs name alike: the
	// first opens it, the others get the same one, and the last to close
	// closes it. An LMDB environment may be opened once per process, so
	// this is how a node's in-process ranks share one index. Only for
	// ranks that write disjoint pages (owner lanes).
	Shared *Shared
}

// Shared holds the indexes shared by the stacks of one process.
type Shared struct {
	mu  sync.Mutex
	ixs map[string]*sharedIndex
}

type sharedIndex struct {
	ix   indexes.Index
	refs int
}

// NewShared returns an empty set of shared indexes.
func NewShared() *Shared { return &Shared{ixs: map[string]*sharedIndex{}} }

// open returns the shared index of key, opening it with open the first
// time, and the function that releases this stack's reference.
func (sh *Shared) open(key string, open func() (indexes.Index, error)) (indexes.Index, func() error, error) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.ixs[key]
	if e == nil {
		ix, err := open()
		if err != nil {
			return nil, nil, err
		}
		e = &sharedIndex{ix: ix}
		sh.ixs[key] = e
	}
	e.refs++
	var once sync.Once
	release := func() error {
		var err error
		once.Do(func() {
			sh.mu.Lock()
			defer sh.mu.Unlock()
			if e.refs--; e.refs == 0 {
				delete(sh.ixs, key)
				err = e.ix.Close()
			}
		})
		return err
	}
	return e.ix, release, nil
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
		ix, release, err := openIndex(ctx, t, regs, opts)
		if err != nil {
			return err
		}
		s.closers = append(s.closers, closer{"index of " + t.Name, release})
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
// plugin, and returns it with the function that closes it (or releases
// this stack's share of it).
func openIndex(ctx context.Context, t config.Tier, regs Registries, opts Options) (indexes.Index, func() error, error) {
	env := indexes.Env{Logger: opts.Logger, Registerer: opts.Registerer}
	if opts.IndexDir != "" {
		env.Dir = filepath.Join(opts.IndexDir, t.Name)
	}
	if t.Index.Plugin != nil {
		ix, err := pluginhost.OpenIndex(ctx, env, FromConfig(t.Name+"-index", *t.Index.Plugin, opts.Plugins))
		if err != nil {
			return nil, nil, fmt.Errorf("open stack: index of tier %q (plugin %s): %w", t.Name, t.Index.Plugin.Path, err)
		}
		return ix, ix.Close, nil
	}
	reg, err := regs.Indexes.Lookup(indexes.IndexV1, t.Index.Use)
	if err != nil {
		return nil, nil, fmt.Errorf("open stack: index of tier %q: %w", t.Name, err)
	}
	open := func() (indexes.Index, error) {
		ix, err := reg.Factory(ctx, env, t.Index.Config)
		if err != nil {
			return nil, fmt.Errorf("open stack: index of tier %q (%s): %w", t.Name, reg.FullID(), err)
		}
		return ix, nil
	}
	if opts.Shared == nil {
		ix, err := open()
		if err != nil {
			return nil, nil, err
		}
		return ix, ix.Close, nil
	}
	// NB: the key is the module, the directory the index keeps its files
	// in and its whole resolved config: two ranks share an index only when
	// they name the same one. A config that cannot say its directory keys
	// on the default one too, so it is shared only under equal defaults.
	dir := env.Dir
	if dc, ok := t.Index.Config.(indexes.DirConfig); ok {
		dir = dc.IndexDir(env.Dir)
	}
	key := fmt.Sprintf("%s\x00%s\x00%+v", reg.FullID(), dir, t.Index.Config)
	return opts.Shared.open(key, open)
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

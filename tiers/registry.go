package tiers

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/registry"
)

// Env is what the host hands a tier at open: everything that is not the
// tier's own config.
type Env struct {
	// Logger receives the tier's logs; never nil (use slog.New(slog.DiscardHandler)).
	Logger *slog.Logger
	// Registerer receives the tier's metrics; nil means do not register.
	Registerer prometheus.Registerer
	// Payload is the stack's payload geometry.
	Payload PayloadGeometry
	// Rank and WorldSize place this host in its context-parallel group.
	Rank, WorldSize int
	// StackID identifies the stack (slab locks, plugin handshakes).
	StackID string
	// Slab is the host's slab; Stores read and write pages through it.
	// Nil when opening the slab itself.
	Slab Slab
	// ColdStart is what a Store does with data left by a previous run.
	ColdStart ColdStart
	// Index is the opened Index v1 of a store whose stack entry has an
	// index: block (the L3 disk store); nil otherwise, and always nil for
	// pools and slabs. The host opens it from that block, hands it here and
	// closes it after the store. A store that needs one refuses nil at open
	// with an error naming the missing block; a store that does not ignores
	// it.
	//
	// NB: this one typed field is the declared dependency, kept on purpose
	// instead of containerd's Registration.Requires plus a by-type lookup,
	// a choice made after reading every user of the field. The graph has
	// one edge, store → index, with no init order to resolve; the stack
	// YAML already declares it per entry, and host/config already refuses
	// an index on anything but a store. One implementation reads the field
	// (tiers/l3disk); the others who set it are its tests, its benchmark,
	// the l3disk example plugin and inspect. Requires would turn this field
	// into a map from role ID to any with a type assertion in each
	// consumer, moving a compile-time check to run time. What it would buy
	// is one earlier error: `kvtier config validate` cannot yet say that
	// l3disk lacks its index: block (l3disk's Open says it). When a second
	// store needs an index, or a store needs a second kind of dependency,
	// replace the field: registry.Registration gains Requires []TypeID,
	// host/config checks each entry against it before anything opens, and
	// Env carries the resolved dependencies by role.
	Index indexes.Index
}

// Validate checks the fields every tier relies on.
func (e Env) Validate() error {
	if e.Logger == nil {
		return fmt.Errorf("tier env: logger is nil")
	}
	if e.Payload.PageTokens <= 0 || len(e.Payload.Kinds) == 0 {
		return fmt.Errorf("tier env: payload geometry is empty")
	}
	if e.WorldSize < 1 || e.Rank < 0 || e.Rank >= e.WorldSize {
		return fmt.Errorf("tier env: rank %d of world size %d", e.Rank, e.WorldSize)
	}
	return nil
}

// Factory opens a tier of one role from its decoded config (the value that
// the registration's NewConfig returned, filled from YAML), or nil.
type Factory[T any] func(ctx context.Context, env Env, cfg any) (T, error)

// Registry is the tier registry of one host: one registry per role, so a
// lookup returns a factory of the right type.
type Registry struct {
	// Pools holds Pool v1 implementations.
	Pools *registry.Registry[Factory[Pool]]
	// Slabs holds Slab v1 implementations.
	Slabs *registry.Registry[Factory[Slab]]
	// Stores holds Store v1 implementations.
	Stores *registry.Registry[Factory[Store]]
}

// NewRegistry returns an empty tier registry.
func NewRegistry() *Registry {
	return &Registry{
		Pools:  registry.New[Factory[Pool]](),
		Slabs:  registry.New[Factory[Slab]](),
		Stores: registry.New[Factory[Store]](),
	}
}

// Role returns the role ID of a tier kind name ("pool", "slab", "store").
func Role(kind string) (registry.TypeID, error) {
	switch kind {
	case "pool":
		return PoolV1, nil
	case "slab":
		return SlabV1, nil
	case "store":
		return StoreV1, nil
	}
	return "", fmt.Errorf("tier role %q: want pool, slab or store", kind)
}

// NewConfig returns a fresh config value for the named tier of the given
// role, for strict decoding, and whether the tier is registered at all.
func (r *Registry) NewConfig(role registry.TypeID, name string) (any, error) {
	var newCfg func() any
	switch role {
	case PoolV1:
		reg, err := r.Pools.Lookup(role, name)
		if err != nil {
			return nil, err
		}
		newCfg = reg.NewConfig
	case SlabV1:
		reg, err := r.Slabs.Lookup(role, name)
		if err != nil {
			return nil, err
		}
		newCfg = reg.NewConfig
	case StoreV1:
		reg, err := r.Stores.Lookup(role, name)
		if err != nil {
			return nil, err
		}
		newCfg = reg.NewConfig
	default:
		return nil, fmt.Errorf("tier role %q: %w", role, registry.ErrNotFound)
	}
	if newCfg == nil {
		return nil, nil
	}
	return newCfg(), nil
}

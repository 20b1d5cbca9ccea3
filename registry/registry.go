// Package registry is the explicit, versioned registry of kvtier modules:
// tiers, indexes and policies register under a typed role ID such as
// "kvtier.tier.store.v1" and a name such as "l3disk".
//
// A Registry is a value that the caller builds and passes in; there is no
// package-level registry and no init-time side effect. Registering the same
// (type, name) twice is an error, never a silent override.
package registry

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// TypeID names a role and the version of its contract, for example
// "kvtier.tier.store.v1". A new contract version is a new TypeID.
type TypeID string

// ErrDuplicate is returned by Register for a (type, name) already present.
var ErrDuplicate = errors.New("duplicate registration")

// ErrNotFound is returned by Lookup for an unknown (type, name).
var ErrNotFound = errors.New("not registered")

// Registration describes one module implementing one role.
//
// F is the role's factory type (each role package defines its own), so a
// lookup returns a factory of the right signature without type assertions.
type Registration[F any] struct {
	// Type is the role and contract version the module implements.
	Type TypeID
	// Name is how a stack config selects the module, unique within Type.
	Name string
	// Doc is a one-line description shown by `kvtier config modules`.
	Doc string
	// NewConfig returns a pointer to a fresh, defaulted config struct that
	// the config loader decodes the module's YAML block into, strictly.
	// If the struct has a `Validate() error` method it is called after
	// decoding. Nil means the module takes no config.
	NewConfig func() any
	// Factory builds the module.
	Factory F
}

// FullID returns "type/name", the identity printed in logs and errors.
func (r Registration[F]) FullID() string { return string(r.Type) + "/" + r.Name }

type key struct {
	typ  TypeID
	name string
}

// Registry holds registrations of one factory type.
type Registry[F any] struct {
	regs map[key]Registration[F]
}

// New returns an empty registry.
func New[F any]() *Registry[F] {
	return &Registry[F]{regs: make(map[key]Registration[F])}
}

// Register adds reg. It fails on an empty type or name, on a name with a
// '/' or a space, and on a (type, name) already registered (ErrDuplicate).
// It does not check that reg.Factory is set: each role package decides
// what a missing factory means.
func (r *Registry[F]) Register(reg Registration[F]) error {
	if reg.Type == "" || reg.Name == "" {
		return fmt.Errorf("register %q: type and name must both be set", reg.FullID())
	}
	if strings.ContainsAny(reg.Name, "/ \t\n") {
		return fmt.Errorf("register %q: name must not contain '/' or spaces", reg.FullID())
	}
	k := key{reg.Type, reg.Name}
	if _, ok := r.regs[k]; ok {
		return fmt.Errorf("register %s: %w", reg.FullID(), ErrDuplicate)
	}
	r.regs[k] = reg
	return nil
}

// Lookup returns the registration for (typ, name). The error of an unknown
// name lists the names that are registered for typ.
func (r *Registry[F]) Lookup(typ TypeID, name string) (Registration[F], error) {
	if reg, ok := r.regs[key{typ, name}]; ok {
		return reg, nil
	}
	known := r.Names(typ)
	return Registration[F]{}, fmt.Errorf("%s/%s: %w (known: %s)", typ, name, ErrNotFound, strings.Join(known, ", "))
}

// Names returns the sorted names registered for typ.
func (r *Registry[F]) Names(typ TypeID) []string {
	var out []string
	for k := range r.regs {
		if k.typ == typ {
			out = append(out, k.name)
		}
	}
	slices.Sort(out)
	return out
}

// All returns every registration sorted by full ID.
func (r *Registry[F]) All() []Registration[F] {
	out := make([]Registration[F], 0, len(r.regs))
	for _, reg := range r.regs {
		out = append(out, reg)
	}
	slices.SortFunc(out, func(a, b Registration[F]) int { return strings.Compare(a.FullID(), b.FullID()) })
	return out
}

// NewConfigOf returns a Registration.NewConfig that yields a pointer to a
// fresh defaults() value, for the config loader to decode YAML into.
func NewConfigOf[C any](defaults func() C) func() any {
	return func() any {
		c := defaults()
		return &c
	}
}

// ErrConfigType is wrapped by ConfigAs when a factory receives a config of
// another module's type.
var ErrConfigType = errors.New("config of the wrong type")

// ConfigAs converts the config a factory receives — the value NewConfigOf
// made, filled from YAML — into C: nil means defaults(), *C and C are taken
// as they are, anything else is an error naming the module.
func ConfigAs[C any](module string, cfg any, defaults func() C) (C, error) {
	switch v := cfg.(type) {
	case nil:
		return defaults(), nil
	case *C:
		if v == nil {
			return defaults(), nil
		}
		return *v, nil
	case C:
		return v, nil
	}
	var zero C
	return zero, fmt.Errorf("%s: config is %T, want %T: %w", module, cfg, &zero, ErrConfigType)
}

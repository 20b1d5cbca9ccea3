// Package assemble puts a rank together from a stack config: it loads the
// config with the built-in modules (builtin.Tiers, Indexes, Policies),
// derives the Machine's options from the opened stack and its policy, and
// builds the control Machine and the host.Node over it. kvtier serve
// (host/serve), kvtier replay --data (host/datareplay) and kvtier sim
// (host/simrun) assemble their ranks with it.
//
// It only assembles: opening the stack (each driver names its files and
// cold start), running the Node and closing the stack stay the driver's.
package assemble

import (
	"fmt"

	"github.com/kvtier/kvtier/host"
	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/host/stack"
	"github.com/kvtier/kvtier/policy"
)

// Load decodes and validates the stack config text (name names it in
// errors) with the built-in modules, and returns it with the registries
// stack.Open needs to open it.
func Load(text []byte, name string) (*config.Stack, stack.Registries, error) {
	tr, err := builtin.Tiers()
	if err != nil {
		return nil, stack.Registries{}, err
	}
	ix, err := builtin.Indexes()
	if err != nil {
		return nil, stack.Registries{}, err
	}
	pr, err := builtin.Policies()
	if err != nil {
		return nil, stack.Registries{}, err
	}
	st, err := config.Load(text, name, config.Modules{Tiers: tr, Indexes: ix, Policies: pr})
	if err != nil {
		return nil, stack.Registries{}, err
	}
	return st, stack.Registries{Tiers: tr, Indexes: ix}, nil
}

// Evictor returns a builder of the stack's eviction policy for the
// Machine's tree. The Machine has no future, so an offline policy is
// refused; runner names the driver in that error ("serve").
func Evictor(st *config.Stack, runner string) (func() (policy.Evictor, error), error) {
	reg, err := builtin.Policies()
	if err != nil {
		return nil, err
	}
	e, err := reg.Lookup(policy.EvictorV1, st.Policy.Evictor)
	if err != nil {
		return nil, fmt.Errorf("policy %q: %w", st.Policy.Evictor, err)
	}
	build := func() (policy.Evictor, error) { return e.Factory(policy.Options{Params: st.Policy.Params}) }
	if _, err := build(); err != nil {
		return nil, fmt.Errorf("policy %q (%s runs online policies only): %w", st.Policy.Evictor, runner, err)
	}
	return build, nil
}

// MachineOptions returns base with the stack-shaped fields filled from
// the opened stack s (host.MachineOptions, the L3 being the store named
// store, empty: the first) and the Machine's evictor built from the
// stack's policy (Evictor; runner names the driver in its error).
func MachineOptions(s *stack.Stack, base control.Options, store, runner string) (control.Options, error) {
	mo, err := host.MachineOptions(s, base, store)
	if err != nil {
		return mo, err
	}
	if mo.NewEvictor, err = Evictor(s.Config, runner); err != nil {
		return mo, err
	}
	return mo, nil
}

// Node builds a Machine from mo and a Node over s that runs it with o.
// group, when set, makes the Node's group from the new Machine (a
// host.ConsensusGroup digests it) and replaces o.Group.
func Node(s *stack.Stack, mo control.Options, o host.Options, group func(*control.Machine) host.Group) (*host.Node, *control.Machine, error) {
	m, err := control.New(mo)
	if err != nil {
		return nil, nil, err
	}
	if group != nil {
		o.Group = group(m)
	}
	n, err := host.New(s, m, o)
	if err != nil {
		return nil, nil, err
	}
	return n, m, nil
}

// Multi builds one Machine from mo for the ranks a node hosts together
// and a host.Multi that carries its decisions out on each rank's stack;
// group, when not nil, builds the Multi's group (the other nodes) around
// the Machine.
func Multi(locals []host.Local, mo control.Options, o host.Options, group func(*control.Machine) host.Group) (*host.Multi, *control.Machine, error) {
	m, err := control.New(mo)
	if err != nil {
		return nil, nil, err
	}
	if group != nil {
		o.Group = group(m)
	}
	mu, err := host.NewMulti(m, locals, o)
	if err != nil {
		return nil, nil, err
	}
	return mu, m, nil
}

package config

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/registry"
	"github.com/kvtier/kvtier/tiers"
)

// Test modules: small registrations whose configs exercise strict typed
// decoding, Validate and ValidateGeometry. Their factories are never called
// by the loader (it only describes stacks) and refuse to open.

var errTestModule = errors.New("test module: the config tests never open tiers")

type testSlabConfig struct {
	Path     string        `yaml:"path"`
	Size     quantity.Size `yaml:"size"`
	Fallback string        `yaml:"fallback"`
}

func (c *testSlabConfig) Validate() error {
	if c.Fallback != "none" && c.Fallback != "shm" {
		return fmt.Errorf("fallback %q: want none or shm", c.Fallback)
	}
	return nil
}

type testStoreConfig struct {
	Dir    string        `yaml:"dir"`
	Budget quantity.Size `yaml:"budget"`
	Align  quantity.Size `yaml:"align"`
	Disks  []string      `yaml:"disks"`
}

func (c *testStoreConfig) ValidateGeometry(g tiers.PayloadGeometry) error {
	for _, k := range g.Kinds {
		if c.Align > 0 && k.PageBytes%int64(c.Align) != 0 {
			return fmt.Errorf("payload %s: page_bytes %d is not a multiple of align %d", k.Name, k.PageBytes, c.Align)
		}
	}
	return nil
}

type testPoolConfig struct {
	Pages  int `yaml:"pages"`
	Device int `yaml:"device"`
}

type testIndexConfig struct {
	MapSize quantity.Size `yaml:"map_size"`
	Sync    bool          `yaml:"sync"`
}

// testEvictor is the smallest Evictor: the loader builds policies only to
// let them check their params, and never calls them.
type testEvictor struct{ name string }

func (e testEvictor) Name() string                   { return e.name }
func (testEvictor) Insert(policy.NodeInfo)           {}
func (testEvictor) Hit(policy.NodeInfo)              {}
func (testEvictor) Update(policy.NodeInfo)           {}
func (testEvictor) Remove(policy.NodeID)             {}
func (testEvictor) SetEvictable(policy.NodeID, bool) {}
func (testEvictor) Victim() (policy.NodeID, bool)    { return 0, false }

func testModules() Modules {
	tr := tiers.NewRegistry()
	must(tr.Slabs.Register(registry.Registration[tiers.Factory[tiers.Slab]]{
		Type: tiers.SlabV1, Name: "testslab", Doc: "test slab",
		NewConfig: func() any { return &testSlabConfig{Size: 64 * quantity.GiB, Fallback: "none"} },
		Factory:   func(context.Context, tiers.Env, any) (tiers.Slab, error) { return nil, errTestModule },
	}))
	must(tr.Stores.Register(registry.Registration[tiers.Factory[tiers.Store]]{
		Type: tiers.StoreV1, Name: "teststore", Doc: "test store",
		NewConfig: func() any { return &testStoreConfig{Budget: quantity.TiB} },
		Factory:   func(context.Context, tiers.Env, any) (tiers.Store, error) { return nil, errTestModule },
	}))
	must(tr.Stores.Register(registry.Registration[tiers.Factory[tiers.Store]]{
		Type: tiers.StoreV1, Name: "nocfg", Doc: "a store without config",
		Factory: func(context.Context, tiers.Env, any) (tiers.Store, error) { return nil, errTestModule },
	}))
	must(tr.Pools.Register(registry.Registration[tiers.Factory[tiers.Pool]]{
		Type: tiers.PoolV1, Name: "testpool", Doc: "test pool",
		NewConfig: func() any { return &testPoolConfig{Pages: 1024} },
		Factory:   func(context.Context, tiers.Env, any) (tiers.Pool, error) { return nil, errTestModule },
	}))
	ir := indexes.NewRegistry()
	must(ir.Register(registry.Registration[indexes.Factory]{
		Type: indexes.IndexV1, Name: "testindex", Doc: "test index",
		NewConfig: func() any { return &testIndexConfig{MapSize: 16 * quantity.GiB, Sync: true} },
		Factory:   func(context.Context, indexes.Env, any) (indexes.Index, error) { return nil, errTestModule },
	}))
	pr := policy.NewRegistry()
	for _, p := range []struct {
		name  string
		known []string
	}{{"lru", nil}, {"slru", []string{"protected_share"}}, {"adaptive", []string{"margin", "decay_shift"}}} {
		must(pr.Register(policy.Registration{
			Type: policy.EvictorV1, Name: p.name,
			Factory: func(o policy.Options) (policy.Evictor, error) {
				if err := policy.CheckParams(p.name, o.Params, p.known...); err != nil {
					return nil, err
				}
				if v, ok := o.Params["protected_share"]; ok && (v <= 0 || v >= 1) {
					return nil, fmt.Errorf("policy %s: protected_share %v not in (0, 1)", p.name, v)
				}
				return testEvictor{p.name}, nil
			},
		}))
	}
	must(pr.Register(policy.Registration{
		Type: policy.EvictorV1, Name: "belady",
		Factory: func(o policy.Options) (policy.Evictor, error) {
			if o.Future == nil {
				return nil, errors.New("policy belady is an offline oracle: it needs the future of a trace and runs only in replay")
			}
			return testEvictor{"belady"}, nil
		},
	}))
	return Modules{Tiers: tr, Indexes: ir, Policies: pr}
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

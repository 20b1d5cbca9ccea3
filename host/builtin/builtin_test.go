package builtin_test

import (
	"context"
	"slices"
	"testing"

	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/planner"
	"github.com/kvtier/kvtier/tiers"
)

// TestBuiltins pins what a user gets without plugins, and that every
// registration is accepted (a duplicate would be an error here).
func TestBuiltins(t *testing.T) {
	tr, err := builtin.Tiers()
	if err != nil {
		t.Fatal(err)
	}
	ix, err := builtin.Indexes()
	if err != nil {
		t.Fatal(err)
	}
	pr, err := builtin.Policies()
	if err != nil {
		t.Fatal(err)
	}
	pl, err := builtin.Planners()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what string
		got  []string
		want []string
	}{
		{"pools", tr.Pools.Names(tiers.PoolV1), []string{"cuda", "engine", "host"}},
		{"slabs", tr.Slabs.Names(tiers.SlabV1), []string{"l2hugetlb"}},
		{"stores", tr.Stores.Names(tiers.StoreV1), []string{"l3disk", "memstore", "redis"}},
		{"indexes", ix.Names(indexes.IndexV1), []string{"badger", "lmdb"}},
		{"policies", pr.Names(policy.EvictorV1), []string{"adaptive", "belady", "hindsight", "lru", "proven", "s3fifo", "sieve", "slru"}},
		{"planners", pl.Names(policy.PlannerV1), planner.Names()},
	} {
		if !slices.Equal(tc.got, tc.want) {
			t.Errorf("built-in %s = %v, want %v", tc.what, tc.got, tc.want)
		}
	}
	for _, name := range planner.Names() {
		reg, err := pl.Lookup(policy.PlannerV1, name)
		if err != nil {
			t.Fatalf("planner %s: %v", name, err)
		}
		if got := reg.Factory(); got == nil || got.Name() != name {
			t.Fatalf("planner %s factory built %v", name, got)
		}
	}
	// Registries are values: a second call builds fresh, independent ones.
	tr2, err := builtin.Tiers()
	if err != nil || tr2 == tr {
		t.Fatalf("second Tiers() = %p, %v; want a new registry", tr2, err)
	}
}

// TestFailedOpensReturnNil opens every built-in module with an env that
// cannot work: each must fail with a nil module, not an interface holding
// a nil pointer (which a caller's `m != nil` would take for an open one).
func TestFailedOpensReturnNil(t *testing.T) {
	tr, err := builtin.Tiers()
	if err != nil {
		t.Fatal(err)
	}
	ix, err := builtin.Indexes()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range tr.Pools.Names(tiers.PoolV1) {
		reg, _ := tr.Pools.Lookup(tiers.PoolV1, name)
		if m, err := reg.Factory(ctx, tiers.Env{}, nil); err == nil || m != nil {
			t.Errorf("pool %s: %v, %v; want nil and an error", name, m, err)
		}
	}
	for _, name := range tr.Slabs.Names(tiers.SlabV1) {
		reg, _ := tr.Slabs.Lookup(tiers.SlabV1, name)
		if m, err := reg.Factory(ctx, tiers.Env{}, nil); err == nil || m != nil {
			t.Errorf("slab %s: %v, %v; want nil and an error", name, m, err)
		}
	}
	for _, name := range tr.Stores.Names(tiers.StoreV1) {
		reg, _ := tr.Stores.Lookup(tiers.StoreV1, name)
		if m, err := reg.Factory(ctx, tiers.Env{}, nil); err == nil || m != nil {
			t.Errorf("store %s: %v, %v; want nil and an error", name, m, err)
		}
	}
	for _, name := range ix.Names(indexes.IndexV1) {
		reg, _ := ix.Lookup(indexes.IndexV1, name)
		if m, err := reg.Factory(ctx, indexes.Env{}, nil); err == nil || m != nil {
			t.Errorf("index %s: %v, %v; want nil and an error", name, m, err)
		}
	}
}

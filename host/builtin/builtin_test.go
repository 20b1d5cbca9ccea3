package builtin_test

import (
	"slices"
	"testing"

	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/policy"
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
	for _, tc := range []struct {
		what string
		got  []string
		want []string
	}{
		{"slabs", tr.Slabs.Names(tiers.SlabV1), []string{"l2hugetlb"}},
		{"stores", tr.Stores.Names(tiers.StoreV1), []string{"l3disk", "memstore", "redis"}},
		{"indexes", ix.Names(indexes.IndexV1), []string{"badger", "lmdb"}},
		{"policies", pr.Names(policy.EvictorV1), []string{"belady", "hindsight", "lru", "proven", "s3fifo", "sieve", "slru"}},
	} {
		if !slices.Equal(tc.got, tc.want) {
			t.Errorf("built-in %s = %v, want %v", tc.what, tc.got, tc.want)
		}
	}
	// Registries are values: a second call builds fresh, independent ones.
	tr2, err := builtin.Tiers()
	if err != nil || tr2 == tr {
		t.Fatalf("second Tiers() = %p, %v; want a new registry", tr2, err)
	}
}

// Package builtin registers kvtier's own modules — tiers, indexes and eviction
// policies — into registries the caller owns. Registries are values: the
// host, the CLI and tests each build their own, and a third party embedding
// kvtier can add modules beside these or leave some out.
package builtin

import (
	"fmt"

	"github.com/kvtier/kvtier/indexes"
	badgerindex "github.com/kvtier/kvtier/indexes/badger"
	lmdbindex "github.com/kvtier/kvtier/indexes/lmdb"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/adaptive"
	"github.com/kvtier/kvtier/policy/belady"
	"github.com/kvtier/kvtier/policy/hindsight"
	"github.com/kvtier/kvtier/policy/lru"
	"github.com/kvtier/kvtier/policy/planner"
	"github.com/kvtier/kvtier/policy/proven"
	"github.com/kvtier/kvtier/policy/s3fifo"
	"github.com/kvtier/kvtier/policy/sieve"
	"github.com/kvtier/kvtier/policy/slru"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l1cuda"
	"github.com/kvtier/kvtier/tiers/l2hugetlb"
	"github.com/kvtier/kvtier/tiers/l3disk"
	"github.com/kvtier/kvtier/tiers/memstore"
	redistier "github.com/kvtier/kvtier/tiers/redis"
)

// Tiers returns a tier registry holding every built-in tier.
func Tiers() (*tiers.Registry, error) {
	r := tiers.NewRegistry()
	for _, register := range []func(*tiers.Registry) error{
		// One line per built-in tier package: pkg.Register,
		memstore.Register,
		l1cuda.Register,
		l2hugetlb.Register,
		l3disk.Register,
		redistier.Register,
	} {
		if err := register(r); err != nil {
			return nil, fmt.Errorf("built-in tiers: %w", err)
		}
	}
	return r, nil
}

// Indexes returns an index registry holding every built-in index.
func Indexes() (*indexes.Registry, error) {
	r := indexes.NewRegistry()
	for _, register := range []func(*indexes.Registry) error{
		// One line per built-in index package: pkg.Register,
		badgerindex.Register,
		lmdbindex.Register,
	} {
		if err := register(r); err != nil {
			return nil, fmt.Errorf("built-in indexes: %w", err)
		}
	}
	return r, nil
}

// Policies returns a policy registry holding every built-in policy.
func Policies() (*policy.Registry, error) {
	r := policy.NewRegistry()
	for _, register := range []func(*policy.Registry) error{
		// One line per built-in policy package: pkg.Register,
		lru.Register,
		slru.Register,
		s3fifo.Register,
		sieve.Register,
		belady.Register,
		proven.Register,
		hindsight.Register,
		adaptive.Register,
	} {
		if err := register(r); err != nil {
			return nil, fmt.Errorf("built-in policies: %w", err)
		}
	}
	return r, nil
}

// Planners returns a planner registry holding every built-in owner-lane
// planner (greedy, heap).
func Planners() (*policy.PlannerRegistry, error) {
	r := policy.NewPlannerRegistry()
	if err := planner.Register(r); err != nil {
		return nil, fmt.Errorf("built-in planners: %w", err)
	}
	return r, nil
}

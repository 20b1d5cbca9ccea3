package l2hugetlb

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtier/kvtier/tiers"
)

// Open creates the slab for a stack (rank 0) or joins the slab rank 0
// created (other ranks: they wait for it, then map the same files), and
// returns it mapped.
//
// The hugetlbfs mount is used when it is there and has room; otherwise,
// with fallback: shm, the slab goes to shm_dir with a warning; without the
// fallback Open fails with ErrNoHugetlbfs or ErrCapacity and an actionable
// message. Files left by a crashed host are handled as cfg.Stale says; files
// of a live process of another stack (or of this stack's previous
// incarnation) are refused with ErrLocked.
func Open(ctx context.Context, env tiers.Env, cfg Config) (*Slab, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("open l2 slab: %w", err)
	}
	if err := env.Validate(); err != nil {
		return nil, fmt.Errorf("open l2 slab: %w", err)
	}
	if env.StackID == "" {
		return nil, fmt.Errorf("open l2 slab: the tier env has no stack id (the slab lock needs one): %w", tiers.ErrInvalid)
	}
	logger := env.Logger.With("tier", "l2hugetlb")
	if env.WorldSize > 1 {
		// A rank of a group names itself; a world of one has no rank
		// to tell (its host, kvtier serve, names its own).
		logger = logger.With("rank", env.Rank)
	}
	var s *Slab
	var err error
	if env.Rank != 0 {
		s, err = join(ctx, logger, cfg, env.StackID)
	} else {
		s, err = create(ctx, logger, cfg, env.StackID)
	}
	if err != nil {
		return nil, fmt.Errorf("open l2 slab (rank %d): %w", env.Rank, err)
	}
	if err := s.registerMetrics(env.Registerer, env.Rank); err != nil {
		return nil, errors.Join(fmt.Errorf("open l2 slab: %w", err), s.Close())
	}
	return s, nil
}

func (s *Slab) registerMetrics(r prometheus.Registerer, rank int) error {
	if r == nil {
		return nil
	}
	// The rank label keeps ranks that share a registry (several ranks in one
	// process, as in tests) from colliding.
	labels := prometheus.Labels{"backing": s.geom.Backing, "stack": s.geom.StackID, "rank": strconv.Itoa(rank)}
	bytes := prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvtier_l2_slab_bytes", Help: "Bytes of the mapped L2 slab files.", ConstLabels: labels})
	files := prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvtier_l2_slab_files", Help: "Number of mapped L2 slab files.", ConstLabels: labels})
	var total int64
	for _, f := range s.geom.Slabs {
		total += f.Size
	}
	bytes.Set(float64(total))
	files.Set(float64(len(s.geom.Slabs)))
	for _, c := range []prometheus.Collector{bytes, files} {
		if err := r.Register(c); err != nil {
			for _, done := range s.metrics {
				r.Unregister(done)
			}
			s.metrics = nil
			return fmt.Errorf("register l2 slab metrics: %w", err)
		}
		s.metrics = append(s.metrics, c)
	}
	s.reg = r
	return nil
}

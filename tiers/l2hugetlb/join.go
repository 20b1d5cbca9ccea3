// The path of ranks other than 0: wait for rank 0's slab, then map the
// same files after checking they match this rank's config.

package l2hugetlb

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/kvtier/kvtier/tiers"
)

// join is the path of ranks other than 0: wait until rank 0's slab is
// created, then map it.
func join(ctx context.Context, logger *slog.Logger, cfg Config, stackID string) (*Slab, error) {
	type candidate struct {
		dir  string
		info backingInfo
	}
	var cands []candidate
	if info, err := probeHugetlbfs(cfg.Mount); err == nil {
		cands = append(cands, candidate{cfg.Mount, info})
	}
	if cfg.Fallback == FallbackShm {
		if info, err := probeShm(cfg.ShmDir); err == nil {
			cands = append(cands, candidate{cfg.ShmDir, info})
		}
	}
	if len(cands) == 0 {
		return nil, fmt.Errorf("no hugetlbfs at %s and no shm fallback to join: %w", cfg.Mount, ErrNoHugetlbfs)
	}
	deadline := time.Now().Add(joinWait)
	for {
		for _, c := range cands {
			lock, state, err := joinLock(lockPath(c.dir, cfg.Name, stackID))
			if err != nil {
				return nil, err
			}
			if state != lockJoined {
				continue
			}
			g, err := joinGeometry(cfg, stackID, c.dir, c.info)
			if err != nil {
				lock.Close()
				return nil, err
			}
			s, err := attachFiles(logger, g, lock)
			if err != nil {
				return nil, err
			}
			logger.Info("l2 slab joined", "backing", g.Backing, "dir", c.dir, "files", len(g.Slabs))
			return s, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("rank 0 of stack %q did not create the slab within %v (looked for %s): %w", stackID, joinWait, lockPath(cands[0].dir, cfg.Name, stackID), ErrStale)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for rank 0's slab: %w", ctx.Err())
		case <-time.After(pollEvery):
		}
	}
}

// joinGeometry finds the slab files rank 0 created and checks they match
// this rank's config.
func joinGeometry(cfg Config, stackID, dir string, info backingInfo) (tiers.SlabGeometry, error) {
	sizes := planSizes(int64(cfg.Size), int64(cfg.MaxSlab), info.pageSize)
	g := tiers.SlabGeometry{PageSize: info.pageSize, Backing: info.kind, StackID: stackID}
	for i, want := range sizes {
		p := slabPath(dir, cfg.Name, i)
		st, err := os.Stat(p)
		if err != nil {
			return g, fmt.Errorf("slab %d of rank 0: %w", i, err)
		}
		if st.Size() != want {
			return g, fmt.Errorf("slab file %s is %d bytes but this rank's config (%s) says %d: ranks disagree on the slab config: %w", p, st.Size(), cfg, want, tiers.ErrInvalid)
		}
		g.Slabs = append(g.Slabs, tiers.SlabFile{ID: tiers.SlabID(i), Path: p, Size: want})
	}
	return g, nil
}

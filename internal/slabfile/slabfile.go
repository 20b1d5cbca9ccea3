// Package slabfile opens a real Slab v1 (tiers/l2hugetlb) that a plugin
// process can attach to, for the plugin tests and the plugin benchmark:
// on the hugetlbfs mount when asked and it has room, else in shm files in
// a directory. It exists so that those tests and that benchmark exercise
// the same slab files and lock protocol a host does; it never allocates
// inside the slab.
package slabfile

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"

	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l2hugetlb"
)

// Open creates a slab of at least size bytes for stack stackID. With
// hugetlbfs set it uses the default hugetlbfs mount when that has room and
// falls back to shm files in shmDir; without, it always uses shmDir. The
// file name is random, so concurrent tests do not collide. Close removes
// the files.
func Open(ctx context.Context, logger *slog.Logger, shmDir, stackID string, size int64, hugetlbfs bool) (*l2hugetlb.Slab, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg := l2hugetlb.DefaultConfig()
	cfg.Size = quantity.Size(size)
	cfg.Name = fmt.Sprintf("kvtier-plugin-%016x", rand.Uint64())
	cfg.Fallback = l2hugetlb.FallbackShm
	cfg.ShmDir = shmDir
	cfg.Stale = l2hugetlb.StaleRemove
	if !hugetlbfs {
		// NB: a mount point that does not exist makes Open take the shm
		// fallback, quietly enough for tests.
		cfg.Mount = filepath.Join(shmDir, "no-hugetlbfs-here")
	}
	env := tiers.Env{
		Logger:    logger,
		Payload:   tiers.PayloadGeometry{PageTokens: 1, Kinds: []tiers.PayloadSpec{{Name: "any", PageBytes: 1}}},
		WorldSize: 1,
		StackID:   stackID,
	}
	s, err := l2hugetlb.Open(ctx, env, cfg)
	if err != nil {
		return nil, fmt.Errorf("slab for plugin tests: %w", err)
	}
	return s, nil
}

package control

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/kvtier/kvtier/host/placement"
	"github.com/kvtier/kvtier/host/radix"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/lru"
	"github.com/kvtier/kvtier/policy/planner"
)

// WritePolicy says when a page resident in L1 is backed up to L2.
type WritePolicy uint8

// The write policies of the seed's cache controller.
const (
	// WriteThrough backs every new node up from L1 to L2 at insert.
	WriteThrough WritePolicy = iota
	// WriteThroughSelective backs a node up once it has been hit
	// Options.SelectiveHits times (the seed: on the second hit).
	WriteThroughSelective
	// WriteBack backs a node up only when L1 evicts it; its L1 pages are
	// released at the backup's commit.
	WriteBack
)

var writePolicyNames = [...]string{"write_through", "write_through_selective", "write_back"}

// String returns the policy's config name, e.g. "write_through".
func (p WritePolicy) String() string {
	if int(p) < len(writePolicyNames) {
		return writePolicyNames[p]
	}
	return fmt.Sprintf("write_policy(%d)", uint8(p))
}

// ParseWritePolicy reads a name String writes.
func ParseWritePolicy(s string) (WritePolicy, error) {
	for i, n := range writePolicyNames {
		if n == s {
			return WritePolicy(i), nil
		}
	}
	return 0, fmt.Errorf("write policy %q: want one of %s", s, strings.Join(writePolicyNames[:], ", "))
}

// Options configure a Machine. Every field that shapes a decision must be
// equal on every rank of a group (it is part of the replicated state's
// meaning, though not of its digest).
type Options struct {
	// Tree configures the radix tree replica. Tiers must be 3 (L1, L2,
	// L3); new pages are resident in L1.
	Tree radix.Options
	// NewEvictor builds the tree's Evictor v1; a flush builds a fresh
	// one. Nil means lru.
	NewEvictor func() (policy.Evictor, error)
	// Planner names the owner-lane planner that chooses L1 victims
	// ("heap" or "greedy"; empty means planner.Default).
	Planner string
	// L1Pages is the size of the L1 pool in pages.
	L1Pages int64
	// FreeRoomRatio is the share of L1 that admission tries to keep free
	// (the watermark, pursued best effort; only the hard deficit gates).
	FreeRoomRatio float64
	// EvictAhead is the share of a tier that an eviction which must
	// happen frees beyond its need, rounded down to pages: an L1 admission
	// that plans evicts that much more of L1, coldest L1 leaves first; an
	// L2 reservation that must evict-to-fit that much more of L2 from its
	// victim list, coldest first, but only victims whose pages are also
	// L3-durable or in L1 (a page is never lost ahead of need). The
	// admissions and reservations after it find room without planning or
	// scanning, so those run once per batch instead of once for each. Like
	// the watermark it is best effort; only the hard deficit gates. 0
	// evicts exactly what each one needs.
	EvictAhead float64
	// L2 is the slab layout the placement allocator places into.
	L2 placement.Layout
	// WritePolicy chooses when L1 pages are backed up to L2.
	WritePolicy WritePolicy
	// SelectiveHits is the hit count at which write_through_selective
	// backs a node up (default 2).
	SelectiveHits uint64
	// L3 says a Store sits below the slab: spill and reload run.
	L3 bool
	// SpillQueueCap bounds the spill queue (entries waiting to be issued).
	SpillQueueCap int
	// SpillInflight bounds the spills issued and not yet durable.
	SpillInflight int
	// ReloadMaxInflight bounds the reloads (lookups and gets) in flight.
	ReloadMaxInflight int
	// ReloadTTL is how many ticks a request is held for its reload before
	// it is released to recompute.
	ReloadTTL uint64
	// DigestEvery puts the digest in Ready every DigestEvery ticks (0:
	// never; Digest can always be called).
	DigestEvery uint64
	// Logger receives the rate-limited fallback lines (nil: slog.Default).
	Logger *slog.Logger
	// LogInterval is the least time between two lines of one fallback.
	LogInterval time.Duration
	// LogClock replaces time.Now for the rate limiter (tests). It never
	// enters a decision.
	LogClock func() time.Time
}

// DefaultEvictAhead is the default EvictAhead, 1/16: in `kvtier sim --ranks
// 8 --ticks 30000` it cuts the planner runs from about 3,600 of 5,800 L1
// admissions (`--evict-ahead 0`) to about 800 with the same bytes moved;
// on the Mooncake trace about 480 of 5,200 admissions plan
// (`BenchmarkMooncakeTrace` logs the counts; docs/perf.md, host).
const DefaultEvictAhead = 1.0 / 16

// DefaultOptions returns options for a small stack: 3 tiers, lru, the heap
// planner, write_through, L3 on, 64 L1 pages, a one-kind L2 of 64 pages of
// 4 KiB, a spill queue of 64 with 8 in flight, 4 reloads in flight held at
// most 8 ticks, a digest every 16 ticks.
func DefaultOptions() Options {
	t := radix.DefaultOptions()
	t.PageTokens = 16
	return Options{
		Tree:              t,
		Planner:           planner.Default,
		L1Pages:           64,
		FreeRoomRatio:     0,
		EvictAhead:        DefaultEvictAhead,
		L2:                SimpleLayout(64, 4096),
		WritePolicy:       WriteThrough,
		SelectiveHits:     2,
		L3:                true,
		SpillQueueCap:     64,
		SpillInflight:     8,
		ReloadMaxInflight: 4,
		ReloadTTL:         8,
		DigestEvery:       16,
		LogInterval:       10 * time.Second,
	}
}

// SimpleLayout returns a one-kind ("kv") L2 layout of pages pages of
// pageBytes bytes in slab 0.
func SimpleLayout(pages, pageBytes int64) placement.Layout {
	return placement.Layout{Kinds: []placement.KindLayout{{
		Name: "kv", PageBytes: pageBytes,
		Regions: []placement.Region{{Slab: 0, Offset: 0, Pages: pages}},
	}}}
}

// Validate reports the first invalid option.
func (o Options) Validate() error {
	if err := o.Tree.Validate(); err != nil {
		return fmt.Errorf("control options: %w", err)
	}
	switch {
	case o.Tree.Tiers != 3:
		return fmt.Errorf("control options: tree tiers must be 3 (L1, L2, L3), got %d", o.Tree.Tiers)
	case o.Tree.Residency != radix.L1:
		return fmt.Errorf("control options: tree insert residency must be L1, got %s", o.Tree.Residency)
	case o.L1Pages < 1:
		return fmt.Errorf("control options: l1_pages must be at least 1, got %d", o.L1Pages)
	case !(o.FreeRoomRatio >= 0 && o.FreeRoomRatio < 1):
		return fmt.Errorf("control options: free_room_ratio must be in [0, 1), got %v", o.FreeRoomRatio)
	case !(o.EvictAhead >= 0 && o.EvictAhead <= 0.5):
		return fmt.Errorf("control options: evict_ahead must be in [0, 0.5], got %v", o.EvictAhead)
	case o.WritePolicy > WriteBack:
		return fmt.Errorf("control options: unknown write policy %d", o.WritePolicy)
	case o.SelectiveHits < 1:
		return fmt.Errorf("control options: selective_hits must be at least 1, got %d", o.SelectiveHits)
	case o.SpillQueueCap < 1 || o.SpillInflight < 1:
		return fmt.Errorf("control options: spill queue cap (%d) and spill in flight (%d) must be at least 1", o.SpillQueueCap, o.SpillInflight)
	case o.ReloadMaxInflight < 1 || o.ReloadTTL < 1:
		return fmt.Errorf("control options: reload max in flight (%d) and reload ttl (%d) must be at least 1", o.ReloadMaxInflight, o.ReloadTTL)
	}
	if err := o.L2.Validate(); err != nil {
		return fmt.Errorf("control options: l2: %w", err)
	}
	if _, err := planner.ByName(o.plannerName()); err != nil {
		return fmt.Errorf("control options: %w", err)
	}
	return nil
}

func (o Options) plannerName() string {
	if o.Planner == "" {
		return planner.Default
	}
	return o.Planner
}

func (o Options) evictor() (policy.Evictor, error) {
	if o.NewEvictor == nil {
		return lru.New(policy.Options{})
	}
	return o.NewEvictor()
}

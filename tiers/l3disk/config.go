package l3disk

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"time"

	"github.com/goccy/go-yaml"

	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/registry"
	"github.com/kvtier/kvtier/tiers"
)

// Disk is one disk (a directory on one device) that holds slab files.
type Disk struct {
	// Dir is the directory; created if missing.
	Dir string `yaml:"dir"`
	// Budget is the space the store may use on this disk, shared by every
	// rank mapped to it and split equally over ranks and payload kinds
	// (the same slot count per kind).
	Budget quantity.Size `yaml:"budget"`
}

// O_DIRECT modes.
const (
	ODirectAuto = "auto"
	ODirectOn   = "on"
	ODirectOff  = "off"
)

// Zero-copy modes (Config.ZeroCopy).
const (
	ZeroCopyAuto = "auto"
	ZeroCopyOn   = "on"
	ZeroCopyOff  = "off"
)

// hugeSlabPage is the slab page size from which ZeroCopyAuto moves pages
// without staging.
const hugeSlabPage = 2 << 20

// Config is the l3disk tier's YAML block.
type Config struct {
	// Disks lists the disks. Required.
	Disks []Disk `yaml:"disks"`
	// RankDisks maps rank r to disk RankDisks[r]; empty means r mod
	// len(Disks). When set, it must have one entry per rank.
	RankDisks []int `yaml:"rank_disks,omitempty"`
	// Slots, when positive, is the slot count per payload kind instead of
	// what the budget allows; it must still fit the budget.
	Slots int64 `yaml:"slots,omitempty"`
	// Depth is the number of reads and of writes in flight (default 8).
	Depth int `yaml:"depth"`
	// GCStart and GCStop are the slot occupancy fractions at which the
	// writer's garbage collection starts and stops (0.90, 0.85).
	GCStart float64 `yaml:"gc_start"`
	GCStop  float64 `yaml:"gc_stop"`
	// GCBatch bounds the pages one GC pass reclaims (default 64), so a
	// put behind it never waits long.
	GCBatch int `yaml:"gc_batch"`
	// ColdStart overrides the host's cold-start mode: "clear" or "load";
	// empty means the host's (tiers.Env.ColdStart), "clear" if unset.
	ColdStart tiers.ColdStart `yaml:"cold_start,omitempty"`
	// ODirect is "auto" (O_DIRECT where the file system allows it,
	// buffered + fdatasync elsewhere, reported once), "on" (fail where
	// refused) or "off".
	ODirect string `yaml:"o_direct"`
	// ZeroCopy says when a page moves between the disk and the slab span
	// directly, with no staging buffer: "auto" (the default) where the
	// slab's memory is in huge pages (l2hugetlb on hugetlbfs), "on" on any
	// slab, "off" never. Only pages of whole 4 KiB blocks in a file of
	// format version 2 qualify; the others are always staged. An O_DIRECT
	// transfer pins its buffer's pages for each I/O: a 2.75 MiB page in
	// 4 KiB pages is 704 pins, and on a never-written shm page a fault as
	// well, which costs more than the staged copy (docs/perf.md).
	ZeroCopy string `yaml:"zero_copy"`
	// RequirePLP refuses to open when the power-loss-protection probe
	// finds fdatasync slower than PLPMaxSync.
	RequirePLP bool `yaml:"require_plp"`
	// PLPMaxSync is the median 4 KiB write+fdatasync latency below which
	// a disk counts as power-loss protected (default 500µs).
	PLPMaxSync time.Duration `yaml:"plp_max_sync"`
	// PLPProbes is the number of probe writes (default 8; 0 skips the
	// probe unless RequirePLP is set).
	PLPProbes int `yaml:"plp_probes"`
}

// DefaultConfig returns a config with every default set and no disks.
func DefaultConfig() Config {
	return Config{
		Depth:      8,
		GCStart:    0.90,
		GCStop:     0.85,
		GCBatch:    64,
		ODirect:    ODirectAuto,
		ZeroCopy:   ZeroCopyAuto,
		PLPMaxSync: 500 * time.Microsecond,
		PLPProbes:  8,
	}
}

// Bounds that catch a unit mistake: no single disk, and no slot count on
// one, comes near them.
const (
	// MaxBudget bounds one disk's budget.
	MaxBudget = 1024 * quantity.TiB
	// MaxSlots bounds slots: MaxBudget in the smallest (4 KiB) slots.
	MaxSlots = int64(MaxBudget) / 4096
)

// Validate checks the config on its own (what needs the world size is
// checked at Open by DiskForRank). Each problem is a registry.FieldError
// naming its field, so the stack loader reports the field's line; all of
// them are joined, the first in field order first.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, registry.FieldErrorf(field, "%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if len(c.Disks) == 0 {
		bad("disks", "at least one disk is required")
	}
	seen := map[string]int{}
	for i, d := range c.Disks {
		dir := fmt.Sprintf("disks[%d].dir", i)
		switch {
		case d.Dir == "":
			bad(dir, "empty")
		case strings.ContainsRune(d.Dir, 0):
			bad(dir, "%q holds a NUL byte", d.Dir)
		default:
			// NB: /mnt/a, /mnt/a/ and /mnt/b/../a are one directory; two
			// disks on it would write the same slab files.
			clean := filepath.Clean(d.Dir)
			if j, ok := seen[clean]; ok {
				bad(dir, "%q repeats disks[%d] (%q): two disks may not share a directory", d.Dir, j, c.Disks[j].Dir)
			} else {
				seen[clean] = i
			}
		}
		budget := fmt.Sprintf("disks[%d].budget", i)
		if d.Budget <= 0 && c.Slots <= 0 {
			bad(budget, "must be positive (or set slots)")
		}
		if d.Budget > MaxBudget {
			bad(budget, "%s is more than %s, larger than any disk", d.Budget, MaxBudget)
		}
	}
	if len(c.Disks) > math.MaxUint16 {
		bad("disks", "%d disks, at most %d", len(c.Disks), math.MaxUint16)
	}
	for r, d := range c.RankDisks {
		if d < 0 || d >= len(c.Disks) {
			bad(fmt.Sprintf("rank_disks[%d]", r), "disk %d out of range [0, %d)", d, len(c.Disks))
		}
	}
	if c.Slots < 0 {
		bad("slots", "%d is negative", c.Slots)
	}
	if c.Slots > MaxSlots {
		bad("slots", "%d is more than %d, more 4 KiB slots than %s holds", c.Slots, MaxSlots, MaxBudget)
	}
	if c.Depth < 1 || c.Depth > 1024 {
		bad("depth", "%d, want 1..1024", c.Depth)
	}
	if !(c.GCStop > 0 && c.GCStop < c.GCStart && c.GCStart <= 1) {
		errs = append(errs, registry.FieldErrorf("gc_start", "gc_start %.3g, gc_stop %.3g: want 0 < gc_stop < gc_start <= 1", c.GCStart, c.GCStop))
	}
	if c.GCBatch < 1 {
		bad("gc_batch", "%d, want >= 1", c.GCBatch)
	}
	switch c.ColdStart {
	case "", tiers.ColdStartClear, tiers.ColdStartLoad:
	default:
		bad("cold_start", "%q, want clear or load", c.ColdStart)
	}
	switch c.ODirect {
	case ODirectAuto, ODirectOn, ODirectOff:
	default:
		bad("o_direct", "%q, want auto, on or off", c.ODirect)
	}
	switch c.ZeroCopy {
	case ZeroCopyAuto, ZeroCopyOn, ZeroCopyOff:
	default:
		bad("zero_copy", "%q, want auto, on or off", c.ZeroCopy)
	}
	if c.PLPMaxSync <= 0 {
		bad("plp_max_sync", "%v, want positive", c.PLPMaxSync)
	}
	if c.PLPProbes < 0 || (c.RequirePLP && c.PLPProbes == 0) {
		bad("plp_probes", "%d, want >= 0 (>= 1 with require_plp)", c.PLPProbes)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("l3disk config: %w", err)
	}
	return nil
}

// DiskForRank returns the disk of rank in a group of worldSize ranks and
// how many ranks share that disk.
func (c *Config) DiskForRank(rank, worldSize int) (disk, ranksOnDisk int, err error) {
	if worldSize < 1 || rank < 0 || rank >= worldSize {
		return 0, 0, fmt.Errorf("l3disk: rank %d of world size %d", rank, worldSize)
	}
	if len(c.Disks) == 0 {
		return 0, 0, fmt.Errorf("l3disk: no disks configured")
	}
	of := func(r int) int { return r % len(c.Disks) }
	if len(c.RankDisks) > 0 {
		if len(c.RankDisks) != worldSize {
			return 0, 0, fmt.Errorf("l3disk config: rank_disks has %d entries, world size is %d", len(c.RankDisks), worldSize)
		}
		of = func(r int) int { return c.RankDisks[r] }
	}
	disk = of(rank)
	if disk < 0 || disk >= len(c.Disks) {
		return 0, 0, fmt.Errorf("l3disk config: rank_disks[%d] = %d out of range [0, %d)", rank, disk, len(c.Disks))
	}
	for r := range worldSize {
		if of(r) == disk {
			ranksOnDisk++
		}
	}
	return disk, ranksOnDisk, nil
}

// SlotsPerKind returns the slot count per payload kind for a rank on a
// disk shared by ranksOnDisk ranks: Slots if set, else what the budget
// allows with the same count for every kind.
func (c *Config) SlotsPerKind(disk, ranksOnDisk int, g tiers.PayloadGeometry) (int64, error) {
	var perSlotSet int64 // one slot of every kind
	for _, k := range g.Kinds {
		if k.PageBytes <= 0 {
			return 0, fmt.Errorf("l3disk: payload %q page_bytes %d", k.Name, k.PageBytes)
		}
		perSlotSet += SlotBytes(k.PageBytes)
	}
	budget := int64(c.Disks[disk].Budget)
	if budget > 0 && ranksOnDisk > 0 {
		share := budget/int64(ranksOnDisk) - int64(len(g.Kinds))*superblockSize
		fit := share / perSlotSet
		if c.Slots > 0 {
			if c.Slots > fit {
				return 0, fmt.Errorf("l3disk config: slots %d need %s per rank on disk %d (%s), budget %s over %d ranks fits %d",
					c.Slots, quantity.Size(c.Slots*perSlotSet), disk, c.Disks[disk].Dir, c.Disks[disk].Budget, ranksOnDisk, fit)
			}
			return c.Slots, nil
		}
		if fit < 1 {
			return 0, fmt.Errorf("l3disk config: disks[%d].budget %s over %d ranks holds no slot (one slot of every kind needs %s)",
				disk, c.Disks[disk].Budget, ranksOnDisk, quantity.Size(perSlotSet))
		}
		return fit, nil
	}
	if c.Slots > 0 {
		return c.Slots, nil
	}
	return 0, fmt.Errorf("l3disk config: disks[%d]: neither budget nor slots set", disk)
}

// String returns the config as YAML that decodes to an equal Config.
func (c Config) String() string {
	b, err := yaml.Marshal(c)
	if err != nil {
		return fmt.Sprintf("l3disk config: %v", err)
	}
	return string(b)
}

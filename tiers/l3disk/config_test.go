package l3disk

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/goccy/go-yaml"

	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/registry"
	"github.com/kvtier/kvtier/tiers"
)

func TestConfigYAML(t *testing.T) {
	src := `
disks:
  - {dir: /mnt/nvme0/kv, budget: 2TiB}
  - {dir: /mnt/nvme1/kv, budget: 1.5TB}
rank_disks: [0, 1, 1, 0]
depth: 16
gc_start: 0.95
gc_stop: 0.9
gc_batch: 32
cold_start: load
o_direct: on
zero_copy: off
require_plp: true
plp_max_sync: 200us
plp_probes: 4
`
	c := DefaultConfig()
	if err := yaml.UnmarshalWithOptions([]byte(src), &c, yaml.Strict()); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("validate: %v", err)
	}
	if c.Disks[0].Budget != 2<<40 || c.Disks[1].Budget != 1500000000000 || c.PLPMaxSync != 200*time.Microsecond ||
		c.ColdStart != tiers.ColdStartLoad || c.Depth != 16 || len(c.RankDisks) != 4 || c.ZeroCopy != ZeroCopyOff {
		t.Fatalf("decoded %+v", c)
	}
	var back Config
	if err := yaml.UnmarshalWithOptions([]byte(c.String()), &back, yaml.Strict()); err != nil {
		t.Fatalf("decode String(): %v\n%s", err, c.String())
	}
	if back.String() != c.String() {
		t.Fatalf("round trip differs:\n%s\n---\n%s", c.String(), back.String())
	}
	bad := DefaultConfig()
	if err := yaml.UnmarshalWithOptions([]byte("disks: []\nbogus: 1\n"), &bad, yaml.Strict()); err == nil {
		t.Fatal("unknown field accepted")
	}
}

func TestConfigValidate(t *testing.T) {
	ok := func() Config {
		c := DefaultConfig()
		c.Disks = []Disk{{Dir: "/a", Budget: 1 << 30}, {Dir: "/b", Budget: 1 << 30}}
		return c
	}
	for _, tc := range []struct {
		name string
		mut  func(c *Config)
		want string
	}{
		{"no disks", func(c *Config) { c.Disks = nil }, "at least one disk"},
		{"empty dir", func(c *Config) { c.Disks[1].Dir = "" }, "disks[1].dir"},
		{"repeated dir", func(c *Config) { c.Disks[1].Dir = "/a" }, "repeats disks[0]"},
		{"repeated dir, other spelling", func(c *Config) { c.Disks[1].Dir = "/b/../a/" }, "disks[1].dir: \"/b/../a/\" repeats disks[0]"},
		{"NUL in dir", func(c *Config) { c.Disks[0].Dir = "/a\x00b" }, "disks[0].dir: \"/a\\x00b\" holds a NUL byte"},
		{"budget beyond any disk", func(c *Config) { c.Disks[1].Budget = 2048 * quantity.TiB }, "disks[1].budget: 2048TiB is more than 1024TiB"},
		{"slots beyond any disk", func(c *Config) { c.Slots = 1 << 40 }, "slots: 1099511627776 is more than"},
		{"no budget", func(c *Config) { c.Disks[0].Budget = 0 }, "disks[0].budget"},
		{"rank map range", func(c *Config) { c.RankDisks = []int{0, 2} }, "rank_disks[1]"},
		{"depth", func(c *Config) { c.Depth = 0 }, "depth"},
		{"gc order", func(c *Config) { c.GCStop = 0.95 }, "gc_stop"},
		{"gc batch", func(c *Config) { c.GCBatch = 0 }, "gc_batch"},
		{"cold start", func(c *Config) { c.ColdStart = "warm" }, "cold_start"},
		{"o_direct", func(c *Config) { c.ODirect = "maybe" }, "o_direct"},
		{"zero_copy", func(c *Config) { c.ZeroCopy = "always" }, "zero_copy"},
		{"plp without probes", func(c *Config) { c.RequirePLP, c.PLPProbes = true, 0 }, "plp_probes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok()
			tc.mut(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("validate: %v, want mention of %q", err, tc.want)
			}
			// The first problem names its field for the stack loader.
			var fe *registry.FieldError
			if !errors.As(err, &fe) || fe.Field == "" || !strings.Contains(err.Error(), fe.Field) {
				t.Errorf("validate: %v: first field error %+v, want one naming a field of the message", err, fe)
			}
		})
	}
	c := ok()
	if err := c.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
}

func TestDiskForRank(t *testing.T) {
	c := DefaultConfig()
	c.Disks = []Disk{{Dir: "/a", Budget: 1}, {Dir: "/b", Budget: 1}, {Dir: "/c", Budget: 1}}
	for _, tc := range []struct {
		rankDisks         []int
		rank, world       int
		disk, ranksOnDisk int
		bad               bool
	}{
		{nil, 0, 8, 0, 3, false},
		{nil, 4, 8, 1, 3, false},
		{nil, 5, 8, 2, 2, false},
		{nil, 0, 1, 0, 1, false},
		{[]int{2, 2, 0, 2}, 1, 4, 2, 3, false},
		{[]int{2, 2, 0}, 1, 4, 0, 0, true},
		{nil, 8, 8, 0, 0, true},
	} {
		c.RankDisks = tc.rankDisks
		d, n, err := c.DiskForRank(tc.rank, tc.world)
		if (err != nil) != tc.bad || (!tc.bad && (d != tc.disk || n != tc.ranksOnDisk)) {
			t.Errorf("map %v rank %d/%d = disk %d (%d ranks), %v; want %d (%d), bad=%v",
				tc.rankDisks, tc.rank, tc.world, d, n, err, tc.disk, tc.ranksOnDisk, tc.bad)
		}
	}
}

func TestSlotsPerKind(t *testing.T) {
	g := tiers.PayloadGeometry{PageTokens: 1, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: 2883584}, {Name: "ix", PageBytes: 100}}}
	per := SlotBytes(2883584) + SlotBytes(100)
	c := DefaultConfig()
	c.Disks = []Disk{{Dir: "/a", Budget: quantity.Size(2 * (10*per + 2*superblockSize))}}
	if n, err := c.SlotsPerKind(0, 2, g); err != nil || n != 10 {
		t.Fatalf("slots = %d, %v; want 10", n, err)
	}
	c.Slots = 11
	if _, err := c.SlotsPerKind(0, 2, g); err == nil || !strings.Contains(err.Error(), "fits 10") {
		t.Fatalf("slots over budget: %v", err)
	}
	c.Slots = 0
	c.Disks[0].Budget = quantity.Size(per)
	if _, err := c.SlotsPerKind(0, 2, g); err == nil || !strings.Contains(err.Error(), "holds no slot") {
		t.Fatalf("tiny budget: %v", err)
	}
}

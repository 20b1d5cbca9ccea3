package l2hugetlb

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/registry"
)

// Fallback says what Open does when the hugetlbfs mount is missing or full.
type Fallback string

const (
	// FallbackNone refuses to open: a missing or full mount is an error.
	FallbackNone Fallback = "none"
	// FallbackShm puts the slab files on ShmDir (a tmpfs) instead, with a
	// warning that the memory is not hugepage-backed.
	FallbackShm Fallback = "shm"
)

// Stale says what Open does with slab files left by a host that is gone
// (a crash): files whose lock no live process holds.
type Stale string

const (
	// StaleFail refuses to open and names the files, so an operator looks
	// before anything is deleted.
	StaleFail Stale = "fail"
	// StaleRemove deletes the stale files and lock and creates fresh ones.
	StaleRemove Stale = "remove"
	// StaleReuse keeps files of the right size (their bytes mean nothing:
	// placement starts empty) and recreates the others.
	StaleReuse Stale = "reuse"
)

// Defaults.
const (
	// DefaultMount is the conventional hugetlbfs mount point.
	DefaultMount = "/dev/hugepages"
	// DefaultShmDir is where the shm fallback puts its files.
	DefaultShmDir = "/dev/shm"
	// DefaultName prefixes the slab and lock file names.
	DefaultName = "kvtier-l2"
	// DefaultMaxSlab caps one slab file: a single CUDA host registration
	// over more than about 1 TiB fails, and a copy may not straddle two
	// registrations, so the slab is split into files of at most this size.
	DefaultMaxSlab = 480 * quantity.GiB
)

// Config is the l2hugetlb block of a stack's YAML.
type Config struct {
	// Size is the total slab size; required. It is rounded up to whole
	// backing pages and split into files of at most MaxSlab.
	Size quantity.Size `yaml:"size"`
	// Mount is the hugetlbfs mount point (2 MiB pages).
	Mount string `yaml:"mount"`
	// Name prefixes the file names: NAME-<i>.slab and NAME.stack-<id>.lock.
	// Two stacks on one mount need different names.
	Name string `yaml:"name"`
	// MaxSlab is the largest single slab file.
	MaxSlab quantity.Size `yaml:"max_slab"`
	// Fallback is none (refuse without hugetlbfs) or shm.
	Fallback Fallback `yaml:"fallback"`
	// ShmDir is the tmpfs directory of the shm fallback.
	ShmDir string `yaml:"shm_dir"`
	// Populate faults every page in at open (MAP_POPULATE), so the first
	// copies do not pay for page faults.
	Populate bool `yaml:"populate"`
	// Mlock locks the mappings in memory; it fails at open if the memlock
	// limit is too low. Hugetlbfs pages are never swapped anyway; this
	// matters for the shm fallback.
	Mlock bool `yaml:"mlock"`
	// Stale is what to do with slab files a crashed host left: fail,
	// remove or reuse.
	Stale Stale `yaml:"stale"`
}

// DefaultConfig returns the defaults; Size is left 0 and must be set.
func DefaultConfig() Config {
	return Config{
		Mount:    DefaultMount,
		Name:     DefaultName,
		MaxSlab:  DefaultMaxSlab,
		Fallback: FallbackNone,
		ShmDir:   DefaultShmDir,
		Stale:    StaleFail,
	}
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// minMaxSlab is the smallest max_slab accepted: one hugepage.
const minMaxSlab = 2 * quantity.MiB

// MaxSize bounds size (and max_slab): more host memory than any machine
// has, so a larger value is a unit mistake.
const MaxSize = 64 * quantity.TiB

// Validate checks the config without touching the system. Each error is a
// registry.FieldError naming its field, so the stack loader reports the
// field's line.
func (c Config) Validate() error {
	if c.Size <= 0 {
		return registry.FieldErrorf("size", "l2hugetlb config: size must be set (e.g. size: 64GiB)")
	}
	if c.Size > MaxSize {
		return registry.FieldErrorf("size", "l2hugetlb config: size %s is more than %s, more host memory than any machine has", c.Size, MaxSize)
	}
	if !filepath.IsAbs(c.Mount) {
		return registry.FieldErrorf("mount", "l2hugetlb config: mount %q must be an absolute path", c.Mount)
	}
	if strings.ContainsRune(c.Mount, 0) {
		return registry.FieldErrorf("mount", "l2hugetlb config: mount %q holds a NUL byte", c.Mount)
	}
	if !nameRE.MatchString(c.Name) {
		return registry.FieldErrorf("name", "l2hugetlb config: name %q must be 1-64 of [A-Za-z0-9_.-], starting with a letter or digit", c.Name)
	}
	if c.MaxSlab < minMaxSlab {
		return registry.FieldErrorf("max_slab", "l2hugetlb config: max_slab %s is below one 2 MiB hugepage", c.MaxSlab)
	}
	if c.MaxSlab > MaxSize {
		return registry.FieldErrorf("max_slab", "l2hugetlb config: max_slab %s is more than %s, more host memory than any machine has", c.MaxSlab, MaxSize)
	}
	switch c.Fallback {
	case FallbackNone, FallbackShm:
	default:
		return registry.FieldErrorf("fallback", "l2hugetlb config: fallback %q: want none or shm", c.Fallback)
	}
	if !filepath.IsAbs(c.ShmDir) {
		return registry.FieldErrorf("shm_dir", "l2hugetlb config: shm_dir %q must be an absolute path", c.ShmDir)
	}
	if strings.ContainsRune(c.ShmDir, 0) {
		return registry.FieldErrorf("shm_dir", "l2hugetlb config: shm_dir %q holds a NUL byte", c.ShmDir)
	}
	switch c.Stale {
	case StaleFail, StaleRemove, StaleReuse:
	default:
		return registry.FieldErrorf("stale", "l2hugetlb config: stale %q: want fail, remove or reuse", c.Stale)
	}
	return nil
}

// String renders the config as a YAML flow mapping that decodes back to
// the same Config.
func (c Config) String() string {
	return fmt.Sprintf("{size: %s, mount: %q, name: %q, max_slab: %s, fallback: %s, shm_dir: %q, populate: %t, mlock: %t, stale: %s}",
		c.Size, c.Mount, c.Name, c.MaxSlab, c.Fallback, c.ShmDir, c.Populate, c.Mlock, c.Stale)
}

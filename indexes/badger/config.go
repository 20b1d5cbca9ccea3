package badger

import (
	"fmt"
	"path/filepath"
	"strconv"
)

// Config is the YAML configuration of the Badger index.
type Config struct {
	// Dir is the directory of the database. Empty means the Env's Dir.
	Dir string `yaml:"dir"`
	// Sync selects durability. true (the default): every batch is fsynced
	// to Badger's write-ahead log before the call returns, so a returned
	// batch survives power loss and kernel crashes. false: a batch is in
	// the WAL's page cache when the call returns; it survives the process
	// being killed (SIGKILL included) but the most recent batches may be
	// lost on power loss or a kernel crash. The index is consistent after
	// recovery either way (every batch is whole or absent).
	Sync bool `yaml:"sync"`
	// MemTableBytes is the size of one memtable. It also bounds a batch:
	// Badger refuses a transaction larger than 15% of it (about 100,000
	// entries of this index at the default 64 MiB).
	MemTableBytes int64 `yaml:"memtable_bytes"`
	// BlockCacheBytes is the cache of table blocks. Records are 32 bytes
	// and lookups are point reads of random hashes, so a small cache does
	// as well as a large one; the OS page cache does the rest.
	BlockCacheBytes int64 `yaml:"block_cache_bytes"`
	// OnCorrupt is what Open does with files Badger cannot read:
	// "set_aside" (default, also when empty) moves them into a sibling
	// directory DIR.corrupt-TIME, logs why at error level, starts an
	// empty database and reports the damage through OpenDamage, so the
	// store rebuilds its entries; "refuse" fails Open with
	// indexes.ErrCorrupt and leaves the files alone.
	OnCorrupt string `yaml:"on_corrupt"`
}

// OnCorrupt modes of Config.OnCorrupt.
const (
	OnCorruptSetAside = "set_aside"
	OnCorruptRefuse   = "refuse"
)

// Limits of the config values.
const (
	minMemTableBytes = 1 << 20
	maxMemTableBytes = 1 << 30
	maxBlockCache    = 64 << 30
)

// DefaultConfig returns the defaults: sync on, 64 MiB memtables, a 16 MiB
// block cache, the Env's directory.
func DefaultConfig() Config {
	return Config{Sync: true, MemTableBytes: 64 << 20, BlockCacheBytes: 16 << 20}
}

// Validate checks the config before anything is opened.
func (c Config) Validate() error {
	if c.MemTableBytes < minMemTableBytes || c.MemTableBytes > maxMemTableBytes {
		return fmt.Errorf("badger index config: memtable_bytes %d outside [%d, %d]", c.MemTableBytes, minMemTableBytes, maxMemTableBytes)
	}
	if c.BlockCacheBytes < 0 || c.BlockCacheBytes > maxBlockCache {
		return fmt.Errorf("badger index config: block_cache_bytes %d outside [0, %d]", c.BlockCacheBytes, int64(maxBlockCache))
	}
	switch c.OnCorrupt {
	case "", OnCorruptSetAside, OnCorruptRefuse:
	default:
		return fmt.Errorf("badger index config: on_corrupt %q: want %q or %q", c.OnCorrupt, OnCorruptSetAside, OnCorruptRefuse)
	}
	return nil
}

// String returns the config as a one-line YAML mapping that decodes back
// into an equal Config.
func (c Config) String() string {
	return fmt.Sprintf("{dir: %s, sync: %t, memtable_bytes: %d, block_cache_bytes: %d, on_corrupt: %s}",
		strconv.Quote(c.Dir), c.Sync, c.MemTableBytes, c.BlockCacheBytes, strconv.Quote(c.OnCorrupt))
}

// IndexDir returns the directory the index keeps its files in: Dir, or
// envDir when Dir is empty (indexes.DirConfig).
func (c Config) IndexDir(envDir string) string {
	if c.Dir == "" {
		return filepath.Clean(envDir)
	}
	return filepath.Clean(c.Dir)
}

package lmdb

import (
	"fmt"
	"path/filepath"
	"strconv"
)

// Sync modes of Config.Sync.
const (
	// SyncFull fsyncs data and meta page at every commit: a returned batch
	// survives power loss and kernel crashes.
	SyncFull = "full"
	// SyncNoMeta (MDB_NOMETASYNC) fsyncs data but not the meta page: after
	// a power loss or kernel crash the last committed batch may be rolled
	// back; the index stays consistent.
	SyncNoMeta = "nometa"
	// SyncNone (MDB_NOSYNC) leaves flushing to the OS: a returned batch
	// survives the process being killed (SIGKILL included) but recent
	// batches may be lost on power loss or a kernel crash, and a file
	// system that reorders writes may leave the index corrupt then.
	SyncNone = "none"
)

// Config is the YAML configuration of the LMDB index.
type Config struct {
	// Dir is the environment's directory (data.mdb and lock.mdb). Empty
	// means the Env's Dir. Every rank of a node names the same directory.
	Dir string `yaml:"dir"`
	// MapSizeBytes is the fixed size of the memory map, the index's
	// capacity; it is set up front and never grown. A put batch that does
	// not fit is refused whole with indexes.ErrFull, and puts leave an
	// eighth of the map (16 to 2048 pages) to deletes (reserve.go).
	// Every process sharing the environment must configure the same size.
	// About 100 bytes of map hold one entry (keys 33 bytes, records 32,
	// B-tree overhead).
	MapSizeBytes int64 `yaml:"map_size_bytes"`
	// MaxReaders is the size of the shared reader table: the most read
	// transactions open at once across every process of the node (each
	// Get, Iterate or Stats call holds one while it runs).
	MaxReaders int `yaml:"max_readers"`
	// Sync is the durability of a committed batch: "full" (default),
	// "nometa" or "none"; see SyncFull, SyncNoMeta and SyncNone.
	Sync string `yaml:"sync"`
	// OnCorrupt is what Open does with a data file that fails its
	// structural check (VerifyFile) or that LMDB calls invalid:
	// "set_aside" (default, also when empty) renames it to
	// data.mdb.corrupt-TIME, logs why at error level, starts an empty
	// environment and reports the damage through OpenDamage, so the
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
	minMapSize    = 256 << 10 // 64 pages: room for a few entries beside the delete reserve
	maxMapSize    = 1 << 44
	minMaxReaders = 8
	maxMaxReaders = 1 << 16
)

// DefaultConfig returns the defaults: a 1 GiB map (about ten million
// entries), 1024 reader slots, full sync, the Env's directory.
func DefaultConfig() Config {
	return Config{MapSizeBytes: 1 << 30, MaxReaders: 1024, Sync: SyncFull}
}

// Validate checks the config before anything is opened.
func (c Config) Validate() error {
	if c.MapSizeBytes < minMapSize || c.MapSizeBytes > maxMapSize {
		return fmt.Errorf("lmdb index config: map_size_bytes %d outside [%d, %d]", c.MapSizeBytes, minMapSize, int64(maxMapSize))
	}
	if c.MaxReaders < minMaxReaders || c.MaxReaders > maxMaxReaders {
		return fmt.Errorf("lmdb index config: max_readers %d outside [%d, %d]", c.MaxReaders, minMaxReaders, maxMaxReaders)
	}
	switch c.Sync {
	case SyncFull, SyncNoMeta, SyncNone:
	default:
		return fmt.Errorf("lmdb index config: sync %q: want %q, %q or %q", c.Sync, SyncFull, SyncNoMeta, SyncNone)
	}
	switch c.OnCorrupt {
	case "", OnCorruptSetAside, OnCorruptRefuse:
	default:
		return fmt.Errorf("lmdb index config: on_corrupt %q: want %q or %q", c.OnCorrupt, OnCorruptSetAside, OnCorruptRefuse)
	}
	return nil
}

// String returns the config as a one-line YAML mapping that decodes back
// into an equal Config.
func (c Config) String() string {
	return fmt.Sprintf("{dir: %s, map_size_bytes: %d, max_readers: %d, sync: %s, on_corrupt: %s}",
		strconv.Quote(c.Dir), c.MapSizeBytes, c.MaxReaders, strconv.Quote(c.Sync), strconv.Quote(c.OnCorrupt))
}

// IndexDir returns the directory the index keeps its files in: Dir, or
// envDir when Dir is empty (indexes.DirConfig).
func (c Config) IndexDir(envDir string) string {
	if c.Dir == "" {
		return filepath.Clean(envDir)
	}
	return filepath.Clean(c.Dir)
}

// Package indexes defines Index v1, the durable map from page key to the
// location of its bytes in a Store (for the disk tier: disk, slot, epoch),
// and the registry through which a stack config selects an implementation.
//
// An Index never decides what is cached; it records where the Store put
// what the host told it to keep. Implementations: indexes/lmdb (shared by all
// ranks of a node) and indexes/badger (one process), and plugins.
package indexes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/registry"
)

// IndexV1 is the role ID of Index v1.
const IndexV1 registry.TypeID = "kvtier.index.v1"

// Sentinel errors callers branch on with errors.Is.
var (
	// ErrFull means the index has no room for the batch (LMDB's
	// MDB_MAP_FULL). Nothing of the batch was written; admission of new
	// pages must stop until space is freed. Existing entries are intact.
	ErrFull = errors.New("index full")
	// ErrInUse means another process holds the index exclusively.
	ErrInUse = errors.New("index in use by another process")
	// ErrCorrupt means a stored record failed to decode. The message names
	// the key; the entry should be treated as absent and deleted.
	ErrCorrupt = errors.New("index record corrupt")
	// ErrClosed is returned by every method called after Close.
	ErrClosed = errors.New("index closed")
	// ErrInvalid means a call broke the contract (slices of different
	// lengths, a malformed key); nothing was read or written.
	ErrInvalid = errors.New("invalid index call")
)

// Key addresses one payload of one page: the page hash and the payload kind
// (the stack's payload index, tiers.PayloadKind). It is the index's own type
// so that this package does not import tiers; tiers.Env carries an Index.
type Key struct {
	// Hash is the page's prefix-chained hash.
	Hash pagehash.Hash
	// Kind is the payload kind.
	Kind uint8
}

// String returns "kind:hash-prefix", for logs and errors.
func (k Key) String() string { return fmt.Sprintf("%d:%s", k.Kind, k.Hash.Short()) }

// Record is where one payload page lives.
type Record struct {
	// Disk is the store's disk number.
	Disk uint16
	// Kind is the payload kind (repeated from the key so a record is
	// self-describing when cross-checked against a slot header).
	Kind uint8
	// Slot is the slot number within the (kind, disk) slab file.
	Slot uint64
	// Epoch is the store epoch the slot was written in; a record of an
	// older epoch than the store's is stale (cold start "clear").
	Epoch uint64
	// LastAccess is the store's logical access time of the page.
	LastAccess uint64
}

// Entry is a key with its record.
type Entry struct {
	Key    Key
	Record Record
}

// Stats summarises an index.
type Stats struct {
	// Entries is the number of keys.
	Entries int64
	// Bytes is the storage the index uses on disk, if known.
	Bytes int64
	// CapacityBytes is the configured limit (LMDB map size), 0 if none.
	CapacityBytes int64
}

// Index v1 is a durable, batched map from Key to Record.
//
// Batches are atomic: a Put, Delete, DeleteIf or Touch batch is applied
// whole or not at all, and is durable when the call returns (subject to the
// implementation's sync setting, which its config documents). Slices passed
// in are not retained. All methods are safe for concurrent use.
//
// Errors: a key that is absent is not an error (Get reports found=false,
// Delete ignores it). ErrFull, ErrInUse and ErrClosed are returned as
// themselves (wrapped); anything else means the index is broken.
type Index interface {
	// Put inserts or replaces the entries.
	Put(ctx context.Context, entries []Entry) error
	// Get looks keys up. dst and found must have len(keys).
	Get(ctx context.Context, keys []Key, dst []Record, found []bool) error
	// Delete removes keys.
	Delete(ctx context.Context, keys []Key) error
	// DeleteIf removes each entry's key only if its stored record still
	// has the same Disk, Slot and Epoch (so a stale reader never deletes a
	// newer record). deleted must have len(entries).
	DeleteIf(ctx context.Context, entries []Entry, deleted []bool) error
	// Touch sets LastAccess of the present keys to at; absent keys are
	// ignored.
	Touch(ctx context.Context, keys []Key, at uint64) error
	// Iterate calls fn for every entry in key order (hash bytes, then
	// kind) from a consistent snapshot. fn's error stops the iteration
	// and is returned.
	Iterate(ctx context.Context, fn func(Entry) error) error
	// Stats returns counters.
	Stats(ctx context.Context) (Stats, error)
	// Close releases the index.
	Close() error
}

// Env is what the host hands an index at open.
type Env struct {
	// Logger receives the index's logs; never nil.
	Logger *slog.Logger
	// Registerer receives metrics; nil means do not register.
	Registerer prometheus.Registerer
	// Dir is the directory the index keeps its files in when its config
	// does not name one.
	Dir string
}

// PrepareDir is the common start of an implementation's Open: it checks ctx
// and the env, picks the directory (configured, else e.Dir) and creates
// it. Errors begin with "open NAME index".
func (e Env) PrepareDir(ctx context.Context, name, configured string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("open %s index: %w", name, err)
	}
	if e.Logger == nil {
		return "", fmt.Errorf("open %s index: env logger is nil", name)
	}
	dir := configured
	if dir == "" {
		dir = e.Dir
	}
	if dir == "" {
		return "", fmt.Errorf("open %s index: neither the config nor the env names a directory", name)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("open %s index %s: %w", name, dir, err)
	}
	return dir, nil
}

// Factory opens an index from its decoded config.
type Factory func(ctx context.Context, env Env, cfg any) (Index, error)

// Registry is the index registry of one host.
type Registry = registry.Registry[Factory]

// NewRegistry returns an empty index registry.
func NewRegistry() *Registry { return registry.New[Factory]() }

// KeySize is the length of an encoded key: the 32-byte hash then the kind.
const KeySize = 33

// EncodeKey writes k in the canonical byte order used by every index
// (hash bytes, then kind), which is also the Iterate order.
func EncodeKey(dst *[KeySize]byte, k Key) {
	copy(dst[:32], k.Hash[:])
	dst[32] = k.Kind
}

// DecodeKey is the inverse of EncodeKey.
func DecodeKey(b []byte) (Key, error) {
	var k Key
	if len(b) != KeySize {
		return k, fmt.Errorf("index key: want %d bytes, got %d: %w", KeySize, len(b), ErrCorrupt)
	}
	copy(k.Hash[:], b[:32])
	k.Kind = b[32]
	return k, nil
}

// Resetter is implemented by an index that can drop every entry at once.
// A store whose index turned out corrupt resets it and rebuilds it from
// its own durable truth (for the disk tier: the slot headers). Entries of
// other ranks sharing the index go too; they become misses.
type Resetter interface {
	// Reset removes every entry.
	Reset(ctx context.Context) error
}

// DirConfig is implemented by an index config that keeps its files in one
// directory: IndexDir returns it, given the Env's Dir as the default. A
// host that opens several stacks in one process uses it to tell that two
// configs name the same index (host/stack.Shared).
type DirConfig interface {
	IndexDir(envDir string) string
}

// DeferredPutter is implemented by an index that can commit a batch without
// flushing it to stable storage: a bulk load (the L3 index rebuild) commits
// its batches while it reads and makes them all durable with one Sync at
// the end, instead of one flush per batch competing with its reads. A
// batch put this way is visible at once and durable only once a later Sync
// returns; until then a power loss may drop it (a process crash does not).
type DeferredPutter interface {
	// PutDeferred is Put without the flush.
	PutDeferred(ctx context.Context, entries []Entry) error
	// Sync makes every committed batch durable.
	Sync(ctx context.Context) error
}

// Recoverer is implemented by an index that can find, at open, that its
// files were damaged, set them aside and start empty instead of refusing
// to open (or crashing the process on a damaged page).
type Recoverer interface {
	// OpenDamage returns why the files found at open were set aside, or
	// nil when the index opened its files as they were. A store that sees
	// a non-nil error rebuilds its entries.
	OpenDamage() error
}

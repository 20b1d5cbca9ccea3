// Package tiers defines the versioned role contracts of kvtier's storage
// tiers — Pool v1 (device pages, L1), Slab v1 (the shared host-memory hub,
// L2) and Store v1 (content-addressed tiers below the slab, L3 and plugins) —
// and the registry through which a stack config selects implementations.
//
// Tiers move bytes and keep their own internal bookkeeping. They never decide
// what the cache contains: placement, admission, eviction and reload are the
// host's decisions, made identically on every rank. Nothing in this package
// may read a wall clock or a rank-local queue on behalf of such a decision.
//
// # Errors: miss versus broken
//
// A cache may always miss. Per-item results that wrap ErrMiss (not found,
// torn, corrupt, stale epoch, tier down) mean "recompute": the host counts
// them and carries on. An error returned by a method itself (not per item)
// means the call could not be carried out at all: a bad argument (wrapping
// ErrInvalid), a closed tier (ErrClosed), or a broken tier (ErrBroken). The
// host marks a broken tier down; its later operations are misses and failed
// writes until it is reopened.
package tiers

import (
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/pagehash"
)

// Sentinel errors callers branch on with errors.Is.
var (
	// ErrMiss marks a per-item result that is a cache miss: the data is not
	// there, or what is there failed verification. Never "wrong bytes".
	ErrMiss = errors.New("miss")
	// ErrInvalid marks a request the tier refuses as malformed: a span out
	// of range or straddling two slabs, an unknown payload kind, a length
	// that does not match the page geometry.
	ErrInvalid = errors.New("invalid request")
	// ErrClosed is returned by every method called after Close.
	ErrClosed = errors.New("tier closed")
	// ErrBroken means the tier can no longer serve (an fsync failed, a
	// plugin died, the device is gone). The host marks it down.
	ErrBroken = errors.New("tier broken")
	// ErrFull is a per-item put result: the tier has no room and could not
	// make any without waiting. It is a failed write, not a broken tier.
	ErrFull = errors.New("tier full")
)

// PayloadKind indexes the payload kinds of a stack (for example 0 = "kv",
// 1 = "index"), in the order the stack config lists them. Each kind has its
// own page_bytes; a page has one payload of each kind.
type PayloadKind uint8

// PayloadGeometry is the per-kind page size of a stack, shared by every tier.
type PayloadGeometry struct {
	// PageTokens is the number of tokens per page.
	PageTokens int
	// Kinds lists the payload kinds in PayloadKind order.
	Kinds []PayloadSpec
}

// PayloadSpec is one payload kind.
type PayloadSpec struct {
	// Name is the kind's name in the config, e.g. "kv".
	Name string
	// PageBytes is the size of one page of this payload in bytes.
	PageBytes int64
}

// PageBytes returns the page size of kind k, or an ErrInvalid error.
func (g PayloadGeometry) PageBytes(k PayloadKind) (int64, error) {
	if int(k) >= len(g.Kinds) {
		return 0, fmt.Errorf("payload kind %d: %w (stack has %d kinds)", k, ErrInvalid, len(g.Kinds))
	}
	return g.Kinds[k].PageBytes, nil
}

// Key addresses one payload of one page in a content-addressed tier.
type Key struct {
	// Hash is the page's prefix-chained hash.
	Hash pagehash.Hash
	// Kind is the payload kind.
	Kind PayloadKind
}

// String returns "kind:hash-prefix", for logs and errors.
func (k Key) String() string { return fmt.Sprintf("%d:%s", k.Kind, k.Hash.Short()) }

// IndexKey converts k to the index's key type.
func (k Key) IndexKey() indexes.Key { return indexes.Key{Hash: k.Hash, Kind: uint8(k.Kind)} }

// Package policy defines the eviction policy modules of kvtier: Evictor v1,
// which orders the evictable leaves of the radix tree, and the registry
// through which a stack config or `kvtier replay --policy` selects one.
//
// A policy is a deterministic value fed only replicated events (insert, hit,
// update, remove, evictable on/off), each carrying the node id and the
// replicated logical time. It must never read a wall clock, a random source
// without a fixed seed, a map iteration order, or anything rank-local: every
// rank of a context-parallel group feeds its replica the same events and must
// get the same victims. Every order a policy keeps is total: ties are broken
// by node id.
package policy

import (
	"fmt"
	"maps"
	"slices"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/registry"
)

// EvictorV1 is the role ID of Evictor v1.
const EvictorV1 registry.TypeID = "kvtier.policy.evictor.v1"

// NodeID identifies a radix node; ids are assigned by the tree in creation
// order, identically on every rank, and never reused.
type NodeID uint64

// NodeInfo is the replicated description of a node carried by every event.
type NodeInfo struct {
	// ID is the node's id.
	ID NodeID
	// Parent is the parent's id (0 for children of the root).
	Parent NodeID
	// Time is the logical time of the event (the tree's replicated clock).
	Time uint64
	// LastAccess is the logical time the node was last inserted or hit.
	LastAccess uint64
	// Hits is how many times the node was matched.
	Hits uint64
	// Depth is the number of pages above the node (its first page's index
	// in the sequence).
	Depth int
	// Pages is the node's length in pages.
	Pages int
	// Children is the node's number of children (a node that has forked is
	// shared by several continuations).
	Children int
	// Tail is the page hash of the node's last page (what trimming frees
	// first). Offline policies use it to look up the future.
	Tail pagehash.Hash
}

// Evictor v1 orders the evictable leaves of one tree replica.
//
// The tree reports every node it creates (Insert), every match that reaches
// it (Hit), every change of its pages, depth or children (Update: split,
// tail trim, child added or removed), its removal (Remove), and whether it
// is currently an evictable leaf (SetEvictable: a leaf with no request lock
// and no backup-pending marker). Victim returns the node the policy would
// evict next among the evictable leaves, without removing it; the tree then
// evicts or trims it and reports the consequences through the same events.
//
// Memory: an Evictor keeps O(1) state per live node plus any bounded ghost
// history its documentation states.
type Evictor interface {
	// Name returns the policy's registered name.
	Name() string
	// Insert reports a new node. It is not evictable until SetEvictable.
	Insert(n NodeInfo)
	// Hit reports that a match reached n at logical time n.Time.
	Hit(n NodeInfo)
	// Update reports a change of n's pages, depth or children.
	Update(n NodeInfo)
	// Remove reports that the node is gone (evicted whole, pruned).
	Remove(id NodeID)
	// SetEvictable reports that id became (true) or stopped being (false)
	// an evictable leaf.
	SetEvictable(id NodeID, evictable bool)
	// Victim returns the next victim among evictable leaves, or false if
	// there is none.
	Victim() (NodeID, bool)
}

// Future answers, for an offline policy, when a page is next used after
// logical time now (or ok=false if never). Only replay can supply one.
type Future interface {
	NextUse(h pagehash.Hash, now uint64) (at uint64, ok bool)
}

// Options configure an evictor.
type Options struct {
	// Params holds policy-specific settings from YAML or the command line
	// (e.g. "protected_share" for slru). Unknown keys are errors.
	Params map[string]float64
	// Future is set by replay for offline policies; nil elsewhere.
	Future Future
}

// Factory builds an evictor.
type Factory func(opts Options) (Evictor, error)

// Registration is an evictor module's registry entry.
type Registration = registry.Registration[Factory]

// Registry is the policy registry of one host.
type Registry = registry.Registry[Factory]

// NewRegistry returns an empty policy registry.
func NewRegistry() *Registry { return registry.New[Factory]() }

// CheckParams returns an error naming the first parameter of params, in
// sorted order, that is not one of known. Offline policies (those that need Options.Future) refuse
// to build without one, so `kvtier serve` rejects them by name.
func CheckParams(name string, params map[string]float64, known ...string) error {
	// NB: map order is random; the keys are sorted so that the same
	// config names the same parameter on every run.
	for _, k := range slices.Sorted(maps.Keys(params)) {
		if !slices.Contains(known, k) {
			return fmt.Errorf("policy %s: unknown parameter %q (known: %v)", name, k, known)
		}
	}
	return nil
}

// RangeParam returns params[key] when it is present and within [0, hi], def
// when it is absent, and an error naming the key and the range otherwise.
func RangeParam(params map[string]float64, key string, def, hi float64) (float64, error) {
	v, ok := params[key]
	if !ok {
		return def, nil
	}
	if !(v >= 0 && v <= hi) {
		return 0, fmt.Errorf("%s %v is outside [0, %v]", key, v, hi)
	}
	return v, nil
}

// RequestInfo is the replicated description of a finished request whose
// pages the tree holds: every rank sees the same request, prompt and
// generated tokens, so these facts are as replicated as the tree's events.
type RequestInfo struct {
	// Leaf is the node holding the request's last cached page (0 when
	// nothing of it is cached).
	Leaf NodeID
	// Time is the tree's logical time when the request finished.
	Time uint64
	// InputTokens is the prompt's length in tokens.
	InputTokens int
	// OutputTokens is the number of tokens the request generated.
	OutputTokens int
	// MatchedPages is how many of the prompt's pages were already cached.
	MatchedPages int
	// Pages are the page hashes of the prompt, in order, when the host
	// reports them (nil otherwise): every rank hashes the same prompt.
	// Pages[MatchedPages:] are the pages the request missed. The slice is
	// valid only during the call; a policy must not keep it.
	Pages []pagehash.Hash
}

// RequestObserver is an optional ability of an Evictor: the host reports
// each finished request once, after the tree has inserted its pages and
// before any later event. Policies use it to learn which kinds of request
// leave pages that are asked for again.
type RequestObserver interface {
	Finished(r RequestInfo)
}

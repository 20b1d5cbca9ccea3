// Package replay replays request traces through the host's radix tree
// (package host/radix) in metadata mode — one capacity per run, in pages,
// no bytes moved — with swappable eviction policies, and reports token hit
// rates side by side with the Belady and infinite-capacity bounds. It is
// the engine of `kvtier replay` and of `kvtier bench radix`.
//
// Semantics: one trace block is one page; a request's
// prefix hit is the longest run of its leading blocks present in the tree;
// then its whole input is inserted, its own blocks locked until the insert
// completes, evicting the policy's victims (leaves, trimmed from the tail
// when only part is needed) as needed; hit tokens = min(512 × hit blocks,
// input_length). A request whose new blocks do not fit even after every
// evictable leaf is gone (it is longer than the capacity) inserts only the
// leading blocks that fit; the rest are counted as not admitted and miss
// again next time. With a lookahead N (Plan.Lookahead), the present pages
// of the next N requests are locked against eviction while a request is
// replayed: the engine's waiting queue as a hint (see waitingQueue).
//
// A replay is deterministic: the same trace, policy and capacity give the
// same result on every machine. This package never reads a wall clock
// inside a replay (only the benchmark times replays) and never writes
// output, neither to stdout nor to files; the CLI formats results and draws
// plots (cmd/kvtier/plot.go), so this package does not import a plotting
// library.
package replay

import (
	"context"
	"fmt"

	"github.com/kvtier/kvtier/host/radix"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/workload"
)

// Infinite is the policy name of the infinite-capacity bound row.
const Infinite = "infinite"

// Result is one (policy, capacity) row. The JSON keys policy,
// capacity_tokens, hit_rate, hit_tokens, input_tokens and evictions are a
// public contract that scripts depend on.
type Result struct {
	// Policy is the evictor's name, or "infinite".
	Policy string `json:"policy"`
	// CapacityTokens is the capacity asked for, 0 for infinite.
	CapacityTokens int64 `json:"capacity_tokens"`
	// CapacityBlocks is floor(CapacityTokens / 512), 0 for infinite.
	CapacityBlocks int64 `json:"capacity_blocks"`
	// HitRate is HitTokens / InputTokens.
	HitRate float64 `json:"hit_rate"`
	// HitTokens is the sum over requests of min(512 × hit blocks, input).
	HitTokens int64 `json:"hit_tokens"`
	// InputTokens is the sum of input lengths.
	InputTokens int64 `json:"input_tokens"`
	// HitBlocks is the number of blocks in prefix hits; Blocks the
	// number of blocks asked for.
	HitBlocks int64 `json:"hit_blocks"`
	Blocks    int64 `json:"blocks"`
	// Evictions counts evicted blocks (pages), whole leaves and tail trims.
	Evictions int64 `json:"evictions"`
	// EvictedNodes counts victims evicted whole; TrimmedNodes victims
	// trimmed from their tail.
	EvictedNodes int64 `json:"evicted_nodes"`
	TrimmedNodes int64 `json:"trimmed_nodes"`
	// Nodes is the tree's node count at the end of the replay.
	Nodes int `json:"nodes"`
	// Pages is the tree's page count at the end of the replay.
	Pages int `json:"pages"`
	// Requests is the number of requests replayed.
	Requests int `json:"requests"`
	// Lookahead is how many waiting requests' present pages were
	// protected from eviction (see Plan.Lookahead); 0 is the plain replay.
	Lookahead int `json:"lookahead"`
	// Misses says why blocks missed.
	Misses MissBreakdown `json:"misses"`
}

// MissBreakdown classifies every missed block (a block after the prefix
// hit) by what happened to it before.
type MissBreakdown struct {
	// NeverSeen: the first request for the block (compulsory miss).
	NeverSeen int64 `json:"never_seen"`
	// Evicted: the block was inserted earlier and left with its whole
	// leaf, then was asked for again.
	Evicted int64 `json:"evicted"`
	// EvictedTail: the block was inserted earlier and was trimmed from
	// the tail of a leaf, then was asked for again.
	EvictedTail int64 `json:"evicted_tail"`
	// NotAdmitted: the block was asked for before but never inserted,
	// because its request did not fit in the capacity.
	NotAdmitted int64 `json:"not_admitted"`
}

// Total returns the number of missed blocks.
func (m MissBreakdown) Total() int64 { return m.NeverSeen + m.Evicted + m.EvictedTail + m.NotAdmitted }

// Capacity converts a capacity in tokens to blocks: floor(tokens / 512);
// 0 means infinite.
func Capacity(tokens int64) int64 { return tokens / workload.BlockTokens }

// fate values of a block, for the miss breakdown.
const (
	fateNone uint8 = iota
	fateInserted
	fateEvicted
	fateTrimmed
	fateNotAdmitted
)

// Run replays tr through a fresh tree fed to ev (which must be fresh) at
// capacityTokens (0 = infinite), with the miss breakdown. progress, if not
// nil, is called now and then with the number of requests replayed since
// its last call.
func Run(tr *Trace, ev policy.Evictor, capacityTokens int64, progress func(int)) (Result, error) {
	return runOne(context.Background(), tr, ev, capacityTokens, 0, true, progress)
}

// RunLookahead is Run with the next lookahead requests of tr protected
// from eviction while each request is replayed (see Plan.Lookahead);
// lookahead 0 is Run.
func RunLookahead(tr *Trace, ev policy.Evictor, capacityTokens int64, lookahead int, progress func(int)) (Result, error) {
	return runOne(context.Background(), tr, ev, capacityTokens, lookahead, true, progress)
}

// runner is one replay in progress.
type runner struct {
	tr       *Trace // nil for an online replay
	name     string
	tree     *radix.Tree
	ev       policy.Evictor
	capacity int
	res      Result
	path     []*radix.Node
	victims  []radix.Victim
	// fate of each unique block, when the breakdown is on.
	fate []uint8
	// queue protects the waiting requests' pages; nil without lookahead.
	queue *waitingQueue
	// grown is the parent of the pages the last request inserted, nil
	// when it inserted none.
	grown *radix.Node
}

func newRunner(tr *Trace, ev policy.Evictor, capacityTokens int64, breakdown bool) (*runner, error) {
	if capacityTokens < 0 {
		return nil, fmt.Errorf("replay: capacity %d tokens is negative", capacityTokens)
	}
	blocks := Capacity(capacityTokens)
	if capacityTokens > 0 && blocks == 0 {
		return nil, fmt.Errorf("replay: capacity %d tokens is less than one %d-token block", capacityTokens, workload.BlockTokens)
	}
	opts := radix.Options{PageTokens: workload.BlockTokens, Tiers: 1, Residency: radix.L1}
	tree, err := radix.New(opts, ev)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	r := &runner{tr: tr, tree: tree, ev: ev, capacity: int(blocks)}
	r.res = Result{
		Policy:         ev.Name(),
		CapacityTokens: capacityTokens,
		CapacityBlocks: blocks,
	}
	if tr != nil {
		r.name = tr.Name
		r.res.InputTokens, r.res.Blocks, r.res.Requests = tr.InputTokens(), int64(tr.Blocks()), tr.Requests()
	}
	if capacityTokens == 0 {
		r.res.Policy = Infinite
	}
	if breakdown {
		r.fate = make([]uint8, tr.UniqueBlocks())
	}
	return r, nil
}

// request replays request i.
func (r *runner) request(i int) error {
	keys, input, off := r.tr.request(i)
	if r.queue == nil {
		return r.requestKeys(i, keys, input, r.tr.output[i], off)
	}
	if err := r.queue.enter(r, i+r.queue.n); err != nil {
		return fmt.Errorf("replay %s: request %d: %w", r.name, i+1, err)
	}
	if err := r.requestKeys(i, keys, input, r.tr.output[i], off); err != nil {
		return err
	}
	// NB: request i's window lock is released after its own request lock,
	// so its pages do not flap evictable in between.
	if err := r.queue.leave(r, i); err != nil {
		return fmt.Errorf("replay %s: request %d: %w", r.name, i+1, err)
	}
	if r.grown != nil {
		if err := r.queue.grew(r, i, r.grown); err != nil {
			return fmt.Errorf("replay %s: request %d: %w", r.name, i+1, err)
		}
	}
	return nil
}

// requestKeys replays one request: its keys, input and output tokens, the
// position of its first key in the trace (for the miss breakdown) and its
// index i (for errors).
func (r *runner) requestKeys(i int, keys []pagehash.Hash, input, output, off int) error {
	tree := r.tree
	var hit int
	r.path, hit = tree.MatchHashes(keys, r.path)
	r.res.HitTokens += int64(min(hit*workload.BlockTokens, input))
	r.res.HitBlocks += int64(hit)
	if r.fate != nil {
		r.classify(keys[hit:], off+hit)
	}
	last := tree.Root()
	if len(r.path) > 0 {
		last = r.path[len(r.path)-1]
	}
	if err := tree.Lock(last); err != nil {
		return fmt.Errorf("replay %s: request %d: %w", r.name, i+1, err)
	}
	insert := len(keys)
	if add := len(keys) - hit; r.capacity > 0 && add > 0 {
		if need := tree.Pages() + add - r.capacity; need > 0 {
			var freed int
			var err error
			r.victims, freed, err = tree.EvictPages(need, r.victims[:0])
			if err != nil {
				return fmt.Errorf("replay %s: request %d: %w", r.name, i+1, err)
			}
			r.account(r.victims)
			// NB: the waiting queue's protection yields to the running
			// request (see waitingQueue).
			for freed < need && r.queue != nil {
				shed, err := r.queue.shed(r, i)
				if err != nil {
					return fmt.Errorf("replay %s: request %d: %w", r.name, i+1, err)
				}
				if !shed {
					break
				}
				var more int
				r.victims, more, err = tree.EvictPages(need-freed, r.victims[:0])
				if err != nil {
					return fmt.Errorf("replay %s: request %d: %w", r.name, i+1, err)
				}
				r.account(r.victims)
				freed += more
			}
			// NB: only a request longer than the capacity runs out of
			// evictable leaves: its own path is locked. Insert what fits.
			insert -= need - freed
		}
	}
	if r.fate != nil {
		for j := hit; j < len(keys); j++ {
			f := fateInserted
			if j >= insert {
				f = fateNotAdmitted
			}
			r.fate[denseOf(&keys[j])] = f
		}
	}
	// NB: the new pages hang below the matched path (only its locked
	// nodes were kept by the evictions), so extend from its last node
	// instead of walking the whole key again.
	leaf, added, err := tree.ExtendBorrowed(last, keys[hit:insert])
	if err != nil {
		return fmt.Errorf("replay %s: request %d: %w", r.name, i+1, err)
	}
	r.grown = nil
	if added > 0 {
		r.grown = leaf.Parent()
	}
	if err := tree.Unlock(last); err != nil {
		return fmt.Errorf("replay %s: request %d: %w", r.name, i+1, err)
	}
	// NB: replay does not model time in flight: a request finishes right
	// after its insert, before the next one arrives.
	tree.Finished(leaf, policy.RequestInfo{InputTokens: input, OutputTokens: output, MatchedPages: hit, Pages: keys})
	return nil
}

func (r *runner) account(victims []radix.Victim) {
	for _, v := range victims {
		r.res.Evictions += int64(v.Pages)
		f := fateTrimmed
		if v.Whole {
			r.res.EvictedNodes++
			f = fateEvicted
		} else {
			r.res.TrimmedNodes++
		}
		if r.fate != nil {
			for k := range v.Hashes {
				r.fate[denseOf(&v.Hashes[k])] = f
			}
		}
	}
}

// classify counts why each block of missed (at trace positions from off)
// missed.
func (r *runner) classify(missed []pagehash.Hash, off int) {
	m := &r.res.Misses
	for j := range missed {
		if r.tr.firstSeen[off+j] {
			m.NeverSeen++
			continue
		}
		switch r.fate[denseOf(&missed[j])] {
		case fateEvicted:
			m.Evicted++
		case fateTrimmed:
			m.EvictedTail++
		default:
			// NB: a block seen before and not present was either evicted
			// or never admitted; fateInserted cannot reach here because
			// an inserted block stays until evicted.
			m.NotAdmitted++
		}
	}
}

func (r *runner) finish() Result {
	res := r.res
	if res.InputTokens > 0 {
		res.HitRate = float64(res.HitTokens) / float64(res.InputTokens)
	}
	res.Nodes = r.tree.Nodes()
	res.Pages = r.tree.Pages()
	return res
}

// unbounded is the evictor of the infinite-capacity bound: with no
// capacity nothing is ever evicted, so it keeps no state and never names
// a victim.
type unbounded struct{}

func (unbounded) Name() string                     { return Infinite }
func (unbounded) Insert(policy.NodeInfo)           {}
func (unbounded) Hit(policy.NodeInfo)              {}
func (unbounded) Update(policy.NodeInfo)           {}
func (unbounded) Remove(policy.NodeID)             {}
func (unbounded) SetEvictable(policy.NodeID, bool) {}
func (unbounded) Victim() (policy.NodeID, bool)    { return 0, false }

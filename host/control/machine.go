// Package control is the pure per-rank control machine of a kvtier host:
// every decision of the cache controller — write-through L1→L2, proactive
// spill L2→L3, load-back L2→L1, reload L3→L2, eviction in every tier,
// admission — taken identically on every rank of a context-parallel group.
//
// A Machine is a deterministic value: no goroutines, no clock, no tier
// interfaces, only value types (spans, keys, copies). Its state has two
// parts. The replicated part — the radix tree replica (host/radix), the L1
// and L2 placements (host/placement), the node markers, the logical tick,
// the spill queue, the ops in flight and the reload holds — changes only
// through the engine's replicated events (Apply: match, insert, extend,
// finish, release, flush), which arrive in the same order on every rank,
// and through Tick(frontier), the one place where local facts become
// replicated ones. The local part — which of its ops this rank finished,
// and with what outcome — changes only through Done, Longest and
// SetTierUp, and reaches the others as the Contribution in Ready. Every
// decision reads the replicated part alone; the Digest proves it.
//
// This package must never start a goroutine, read a clock for a decision,
// do I/O, or let a local fact steer a decision outside Tick.
package control

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/kvtier/kvtier/host/placement"
	"github.com/kvtier/kvtier/host/radix"
	"github.com/kvtier/kvtier/internal/idtable"
	"github.com/kvtier/kvtier/internal/ratelog"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
)

// spillState is where a node's spill stands.
type spillState uint8

const (
	spillNone spillState = iota
	// spillQueued: in the spill queue, not issued.
	spillQueued
	// spillPinned: issued and not yet gathered on every rank: the slab
	// pages are being read, so the node is no L2 victim.
	spillPinned
	// spillGathered: gathered everywhere, durable not yet applied.
	spillGathered
)

// mark is the Machine's replicated per-node state beside the tree's own
// (residency, lock refs and the backup-pending marker live in the tree).
type mark struct {
	// first is the node's first page hash (its key in Machine.first).
	first pagehash.Hash
	// parent is the node's parent (kept so a removed node's parent is
	// known). l1Kids and l2Kids count its children holding an L1 / L2
	// object (derived, not digested).
	parent         policy.NodeID
	l1Kids, l2Kids int
	// node is the tree's node (valid while the node is in the tree).
	node *radix.Node
	// l1 is the node's L1 object (0: none).
	l1 placement.ObjectID
	// l2 is the node's L2 object (0: none); l2Pending while its backup
	// is in flight (reserved, not committed).
	l2        placement.ObjectID
	l2Pending bool
	// backupOp is the backup in flight; dropL1 releases L1 at its commit
	// (write-back).
	backupOp OpID
	dropL1   bool
	// spill and spillOp track the node's spill.
	spill   spillState
	spillOp OpID
	// loadOp is the load-back in flight into the node's L1 object.
	loadOp OpID
}

// opKind is what an op does.
type opKind uint8

const (
	opBackup opKind = iota + 1
	opLoadBack
	opSpill
	opLookup
	opReload
)

// deferredSplit is a split of a node whose L2 object is not committed yet:
// placement splits only committed objects, so it is applied at the commit.
type deferredSplit struct {
	suffix, prefix policy.NodeID
	at             int64
}

// op is one operation in flight. Its replicated fields are set when it is
// issued and at the frontier; local holds this rank's completions.
type op struct {
	id   OpID
	kind opKind
	// nodes are the nodes the op covers (split halves join); node0 holds
	// the first one, so an op of one node allocates no list.
	nodes []policy.NodeID
	node0 [1]policy.NodeID
	// obj is the L2 object of a backup (the one reserved) or a reload.
	obj      placement.ObjectID
	deferred []deferredSplit
	// hashes are a spill's or a lookup's pages; depth is the position
	// of hashes[0] in its key.
	hashes []pagehash.Hash
	depth  int
	// reload is the reload key of a lookup or reload op.
	reload pagehash.Hash
	// gatherFailed: the gathered frontier reported a failure.
	gatherFailed bool
	// local: this rank's completions, by stage; never digested.
	local [StageFound + 1]localDone
}

type localDone struct {
	done, ok bool
	value    int
}

// request is the replicated state of one engine request.
type request struct {
	// lock is the node the request's lock is on (nil: none).
	lock *radix.Node
	// held: waiting for reload.
	held     bool
	deadline uint64
	reload   pagehash.Hash
}

// reload is one reload in flight: a lookup, then a get.
type reload struct {
	key pagehash.Hash
	// The request's key at its match, in two parts: pre holds its first
	// m pages, the pages matched when the lookup was issued, as the hash
	// arrays of the nodes that held them (a tree never writes a node's
	// hashes, so they keep what they held even if the nodes leave), and
	// suf is a copy of the rest, the pages the reload looks up and gets.
	// NB: no copy of the matched prefix, usually most of the key.
	pre     [][]pagehash.Hash
	suf     []pagehash.Hash
	m       int
	c       int
	obj     placement.ObjectID
	op      OpID
	waiters []ReqID
	// prefetch: started by a hint, not by a request; it goes on with no
	// waiters and lands in L2.
	prefetch bool
}

// reloadObjectBase puts reload objects in their own id space: a node's
// L2 object is its node id, but a reload's object exists before its node.
const reloadObjectBase = placement.ObjectID(1) << 62

// Machine is one rank's control machine. It is not safe for concurrent
// use: its driver (host.Node) owns it.
type Machine struct {
	opts Options
	tree *radix.Tree
	obs  *observer
	l1   *placement.Allocator
	l2   *placement.Allocator
	plan policy.Planner
	log  *ratelog.Log

	tick uint64
	// marks are the nodes' marks by node id (no map lookup for the
	// recent ones: idtable).
	marks idtable.Table[policy.NodeID, *mark]
	// first maps a node's first page hash to the node (the reload's
	// duplicate recheck; the tree has no read-only lookup).
	first     map[pagehash.Hash]policy.NodeID
	reqs      map[ReqID]*request
	ops       idtable.Table[OpID, *op] // ops in flight by id
	nextOp    OpID
	pipelines [NumPipelines][]OpID // ops issued, not yet applied, in issue order
	applied   [NumPipelines]uint64
	queue     []policy.NodeID // spill queue, commit order
	inflight  int             // spills issued, not yet durable
	reloads   map[pagehash.Hash]*reload
	// The engine's waiting-queue hint (upcoming.go), replicated: the nodes
	// it keeps in L2 with their pages, their total, the keys of this hint,
	// and when each prefetch found nothing in L3.
	protect      map[policy.NodeID]int
	protectPages int64
	hintKeys     int
	prefetchMiss map[pagehash.Hash]uint64
	reloadN      uint64 // reload objects handed out
	tierDown     uint8  // replicated: bit t-1 set when tier t is down on some rank
	localUp      uint8  // local: bit t-1 set when tier t is up here

	// Derived indexes of the markers, never digested: the nodes holding
	// an L1 / L2 object (how many of a node's children do is in its mark).
	l1Set, l2Set nodeSet
	// l2Pages is the fewest pages of any L2 kind (what evict ahead takes
	// a share of).
	l2Pages int64

	expireBuf []ReqID
	// retired are the ops retired this tick, freeOps the zeroed ones
	// issue reuses (never digested).
	retired, freeOps []*op
	tickIDs          []OpID
	planBuf          []policy.PlanNode
	victimBuf        []victim
	countBuf         []int

	// counts are the skips by "<reason> at <where>", events the other
	// counters.
	counts map[string]uint64
	events [numCounters]uint64
	out    pending
	// spareWork holds the work lists handed out at the last Advance
	// (Advance swaps them with the output's), arena the arrays the
	// output's spans and ranges are cut from.
	spareWork pending
	arena     arena
	pathB     []*radix.Node
	// keyBuf is where a landing reload's key is put back together.
	keyBuf []pagehash.Hash
}

// New returns a fresh Machine.
func New(opts Options) (*Machine, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	m := &Machine{opts: opts, counts: map[string]uint64{}, localUp: 0xff}
	m.log = ratelog.New(opts.Logger, opts.LogInterval, ratelog.WithClock(opts.logClock()))
	if err := m.reset(); err != nil {
		return nil, err
	}
	return m, nil
}

// reset builds the replicated state afresh.
func (m *Machine) reset() error {
	ev, err := m.opts.evictor()
	if err != nil {
		return fmt.Errorf("control: evictor: %w", err)
	}
	m.obs = &observer{Evictor: ev}
	if m.tree, err = radix.New(m.opts.Tree, m.obs); err != nil {
		return fmt.Errorf("control: tree: %w", err)
	}
	if m.l1, err = placement.New(SimpleLayout(m.opts.L1Pages, 1)); err != nil {
		return fmt.Errorf("control: l1 placement: %w", err)
	}
	if m.l2, err = placement.New(m.opts.L2); err != nil {
		return fmt.Errorf("control: l2 placement: %w", err)
	}
	m.l2Pages = slices.Min(m.l2.Stats().TotalPages)
	if m.plan, err = plannerByName(m.opts.plannerName()); err != nil {
		return err
	}
	m.tick = 0
	m.marks = idtable.New[policy.NodeID, *mark](1)
	m.l1Set, m.l2Set = newNodeSet(), newNodeSet()
	m.first = map[pagehash.Hash]policy.NodeID{}
	m.reqs = map[ReqID]*request{}
	m.ops = idtable.New[OpID, *op](1)
	m.nextOp = 1
	m.pipelines = [NumPipelines][]OpID{}
	m.applied = [NumPipelines]uint64{}
	m.queue = nil
	m.inflight = 0
	m.reloads = map[pagehash.Hash]*reload{}
	m.reloadN = 0
	m.tierDown = 0
	m.protect = map[policy.NodeID]int{}
	m.protectPages, m.hintKeys = 0, 0
	m.prefetchMiss = map[pagehash.Hash]uint64{}
	return nil
}

// Options returns the Machine's options.
func (m *Machine) Options() Options { return m.opts }

// Ticks returns the number of ticks applied.
func (m *Machine) Ticks() uint64 { return m.tick }

// issue starts an op on the given pipelines and returns it.
func (m *Machine) issue(kind opKind, pipelines ...Pipeline) *op {
	var o *op
	if n := len(m.freeOps); n > 0 {
		o, m.freeOps = m.freeOps[n-1], m.freeOps[:n-1]
		*o = op{id: m.nextOp, kind: kind}
	} else {
		o = &op{id: m.nextOp, kind: kind}
	}
	m.nextOp++
	m.ops.Put(o.id, o)
	for _, l := range pipelines {
		m.pipelines[l] = append(m.pipelines[l], o.id)
	}
	return o
}

// retire forgets an op once its last pipeline applied it. The op's memory is
// reused only after the tick (recycleOps): the code that retires it may
// still read it, and may issue new ops meanwhile.
func (m *Machine) retire(o *op) {
	m.ops.Del(o.id)
	m.retired = append(m.retired, o)
}

// maxFreeOps bounds the free list of op structs.
const maxFreeOps = 1024

// recycleOps zeroes the ops retired during this tick and keeps them for
// issue: nothing refers to them any more (the map forgot them, ids are
// never reused, and what went out in Ready copied their slices, not them).
func (m *Machine) recycleOps() {
	for i, o := range m.retired {
		if len(m.freeOps) < maxFreeOps {
			*o = op{}
			m.freeOps = append(m.freeOps, o)
		}
		m.retired[i] = nil
	}
	m.retired = m.retired[:0]
}

// Contribution returns this rank's local progress for the next frontier.
func (m *Machine) Contribution() Contribution {
	c := Contribution{Tick: m.tick, TierUp: m.localUp}
	// NB: one array holds every pipeline's ok bits; the pipelines'
	// slices are
	// cut from it once it stopped growing.
	var oks []bool
	var at [NumPipelines + 1]int
	for l := range NumPipelines {
		p := PipelineProgress{Base: m.applied[l], Done: m.applied[l]}
		st := pipelineStage(Pipeline(l))
		for _, id := range m.pipelines[l] {
			d := m.ops.Get(id).local[st]
			if !d.done {
				break
			}
			p.Done++
			oks = append(oks, d.ok)
			if Pipeline(l) == PipelineLookup {
				p.Values = append(p.Values, d.value)
			}
		}
		c.Pipelines[l] = p
		at[l+1] = len(oks)
	}
	for l := range NumPipelines {
		if at[l+1] > at[l] {
			c.Pipelines[l].OK = oks[at[l]:at[l+1]:at[l+1]]
		}
	}
	return c
}

func pipelineStage(l Pipeline) Stage {
	switch l {
	case PipelineBackup, PipelineLoadBack:
		return StageCopied
	case PipelineGather:
		return StageGathered
	case PipelineDurable:
		return StageDurable
	case PipelineLookup:
		return StageFound
	}
	return StageLoaded
}

// ErrUnknownOp marks a completion of an op the Machine does not know (never
// issued, or already applied).
var ErrUnknownOp = errors.New("unknown op")

// ErrStage marks a completion of an op in a stage it does not have, twice,
// or out of order (durable before gathered).
var ErrStage = errors.New("wrong stage")

// Done records that this rank finished op in stage, with ok telling
// whether it succeeded. It only bumps local progress: the outcome becomes
// replicated at the tick whose frontier covers it.
func (m *Machine) Done(id OpID, stage Stage, ok bool) error {
	o, err := m.localOp(EvDone, id, stage)
	if err != nil {
		return err
	}
	o.local[stage] = localDone{done: true, ok: ok}
	return nil
}

// Longest records this rank's answer to a lookup: the longest prefix of
// its pages durable in the Store (0 when the Store is down or holds none).
func (m *Machine) Longest(id OpID, pages int) error {
	o, err := m.localOp(EvLongest, id, StageFound)
	if err != nil {
		return err
	}
	if pages < 0 || pages > len(o.hashes) {
		return &EventError{Kind: EvLongest, Op: id, Err: fmt.Errorf("%d pages of a %d-page lookup: %w", pages, len(o.hashes), ErrStage)}
	}
	o.local[StageFound] = localDone{done: true, ok: true, value: pages}
	return nil
}

// opStages are the stages each kind of op finishes in, in order.
var opStages = [...][]Stage{
	opBackup:   {StageCopied},
	opLoadBack: {StageCopied},
	opSpill:    {StageGathered, StageDurable},
	opLookup:   {StageFound},
	opReload:   {StageLoaded},
}

func (m *Machine) localOp(kind EventKind, id OpID, stage Stage) (*op, error) {
	refuse := func(format string, args ...any) error {
		return &EventError{Kind: kind, Op: id, Err: fmt.Errorf(format, args...)}
	}
	o := m.ops.Get(id)
	if o == nil {
		return nil, refuse("stage %s: never issued or already applied: %w", stage, ErrUnknownOp)
	}
	want := opStages[o.kind]
	if !slices.Contains(want, stage) {
		return nil, refuse("stage %s: the op finishes in %v: %w", stage, want, ErrStage)
	}
	if o.local[stage].done {
		return nil, refuse("stage %s reported twice: %w", stage, ErrStage)
	}
	if stage == StageDurable && !o.local[StageGathered].done {
		return nil, refuse("stage durable before gathered: %w", ErrStage)
	}
	return o, nil
}

// SetTierUp records whether this rank can reach tier (1-based). A tier down
// on any rank is down for the group from the next tick.
func (m *Machine) SetTierUp(tier int, up bool) error {
	if tier < 1 || tier > radix.MaxTiers {
		return &EventError{Kind: EvTier, Err: fmt.Errorf("tier %d: want 1..%d: %w", tier, radix.MaxTiers, ErrContract)}
	}
	if up {
		m.localUp |= 1 << (tier - 1)
	} else {
		m.localUp &^= 1 << (tier - 1)
	}
	return nil
}

func (m *Machine) l3Usable() bool { return m.opts.L3 && m.tierDown&(1<<2) == 0 }

// Digest returns the SHA-256 of the replicated state: the tick, the tree,
// both placements, every node's markers, the ops in flight, the pipelines,
// the spill queue, the requests and their holds, the reloads, the tier state.
// Two replicas that applied the same events and frontiers agree.
func (m *Machine) Digest() [32]byte {
	p := m.digestParts()
	d := sha256.New()
	d.Write(p.head)
	d.Write(p.marks)
	d.Write(p.queues)
	var out [32]byte
	d.Sum(out[:0])
	return out
}

// Structures of the replicated state, in the order StructureDigests
// returns their digests (the same order as host/consensus's).
const (
	StructTree = iota
	StructPlacement
	StructMarkers
	StructQueues
	NumStructures
)

// StructureDigests returns one digest per replicated structure: the
// radix tree, the L1 and L2 placement, the node markers, and the queues
// (ops, pipelines, spill queue, requests, reloads). Two ranks whose Digest
// differs differ in at least one of them; a group names the first.
func (m *Machine) StructureDigests() [NumStructures][32]byte {
	p := m.digestParts()
	var out [NumStructures][32]byte
	out[StructTree] = p.tree
	h := sha256.New()
	h.Write(p.l1[:])
	h.Write(p.l2[:])
	h.Sum(out[StructPlacement][:0])
	out[StructMarkers] = sha256.Sum256(p.marks)
	out[StructQueues] = sha256.Sum256(p.queues)
	return out
}

// digestParts is the canonical encoding of the replicated state in its
// sections: Digest hashes head, marks and queues in that order.
type digestParts struct {
	head, marks, queues []byte
	tree, l1, l2        [32]byte
}

func (m *Machine) digestParts() digestParts {
	var p digestParts
	var b []byte
	u := func(v uint64) { b = binary.LittleEndian.AppendUint64(b, v) }
	b = append(b, "kvtier.control.v1\n"...)
	u(m.tick)
	p.tree = m.tree.Digest()
	b = append(b, p.tree[:]...)
	p.l1 = m.l1.Digest()
	b = append(b, p.l1[:]...)
	p.l2 = m.l2.Digest()
	b = append(b, p.l2[:]...)
	p.head, b = b, nil
	ids := m.marks.AppendIDs(nil)
	u(uint64(len(ids)))
	for _, id := range ids {
		k := m.marks.Get(id)
		u(uint64(id))
		u(uint64(k.l1))
		u(uint64(k.l2))
		u(b2u(k.l2Pending) | b2u(k.dropL1)<<1 | uint64(k.spill)<<2)
		u(uint64(k.backupOp))
		u(uint64(k.spillOp))
		u(uint64(k.loadOp))
	}
	p.marks, b = b, nil
	opIDs := m.ops.AppendIDs(nil)
	u(uint64(len(opIDs)))
	for _, id := range opIDs {
		o := m.ops.Get(id)
		u(uint64(o.id))
		u(uint64(o.kind))
		u(uint64(o.obj))
		u(b2u(o.gatherFailed))
		u(uint64(len(o.nodes)))
		for _, n := range o.nodes {
			u(uint64(n))
		}
		u(uint64(len(o.deferred)))
		for _, s := range o.deferred {
			u(uint64(s.suffix))
			u(uint64(s.prefix))
			u(uint64(s.at))
		}
		u(uint64(len(o.hashes)))
		for _, h := range o.hashes {
			b = append(b, h[:]...)
		}
		u(uint64(o.depth))
		b = append(b, o.reload[:]...)
	}
	u(uint64(m.nextOp))
	for l := range NumPipelines {
		u(m.applied[l])
		u(uint64(len(m.pipelines[l])))
		for _, id := range m.pipelines[l] {
			u(uint64(id))
		}
	}
	u(uint64(len(m.queue)))
	for _, n := range m.queue {
		u(uint64(n))
	}
	u(uint64(m.inflight))
	reqIDs := sortedKeys(m.reqs)
	u(uint64(len(reqIDs)))
	for _, id := range reqIDs {
		r := m.reqs[id]
		u(uint64(id))
		if r.lock != nil {
			u(uint64(r.lock.ID()))
		} else {
			u(0)
		}
		u(b2u(r.held))
		u(r.deadline)
		b = append(b, r.reload[:]...)
	}
	keys := make([]pagehash.Hash, 0, len(m.reloads))
	for k := range m.reloads {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b pagehash.Hash) int { return slices.Compare(a[:], b[:]) })
	u(uint64(len(keys)))
	for _, k := range keys {
		r := m.reloads[k]
		b = append(b, k[:]...)
		u(uint64(r.keyLen()))
		for _, seg := range r.pre {
			for _, h := range seg {
				b = append(b, h[:]...)
			}
		}
		for _, h := range r.suf {
			b = append(b, h[:]...)
		}
		u(uint64(r.m))
		u(uint64(r.c))
		u(uint64(r.obj))
		u(uint64(r.op))
		u(uint64(len(r.waiters)) | b2u(r.prefetch)<<63)
		for _, w := range r.waiters {
			u(uint64(w))
		}
	}
	u(m.reloadN)
	u(uint64(m.tierDown))
	b = m.digestUpcoming(b)
	p.queues = b
	return p
}

func b2u(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}

func sortedKeys[K ~uint64, V any](mp map[K]V) []K {
	ks := make([]K, 0, len(mp))
	for k := range mp {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

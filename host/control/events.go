package control

import (
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/host/radix"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
)

// EventKind is the kind of an Event.
type EventKind uint8

// The event kinds: replicated engine events first, then local ones.
const (
	// EvMatch: a request looks up its key (replicated).
	EvMatch EventKind = iota + 1
	// EvInsert: a request's key is cached from the root (replicated).
	EvInsert
	// EvExtend: pages follow a node, a chunk of a chunked prefill
	// (replicated).
	EvExtend
	// EvFinish: a request finished (replicated).
	EvFinish
	// EvRelease: a request's lock is released (replicated).
	EvRelease
	// EvFlush: drop the whole cache (replicated).
	EvFlush
	// EvDone: a local op finished a stage (local).
	EvDone
	// EvLongest: a lookup's answer (local).
	EvLongest
	// EvTier: a tier went up or down here (local).
	EvTier
	// EvUpcoming: the engine's waiting queue as a hint (replicated): with
	// no hashes it clears the hint, else it adds one waiting request's
	// key (upcoming.go).
	EvUpcoming
)

var eventNames = [...]string{"", "match", "insert", "extend", "finish", "release", "flush", "done", "longest", "tier", "upcoming"}

// String returns the kind's name in the text encoding.
func (k EventKind) String() string {
	if int(k) < len(eventNames) && k > 0 {
		return eventNames[k]
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// Replicated reports whether events of this kind must reach every rank in
// the same order.
func (k EventKind) Replicated() bool { return k >= EvMatch && k <= EvFlush || k == EvUpcoming }

// Event is one input of the Machine, as the text encoding (ParseEvent)
// decodes it. Fields a kind does not use are zero.
type Event struct {
	// Kind is the event's kind.
	Kind EventKind
	// Req is the request (match, insert, extend, finish, release).
	Req ReqID
	// Node is the node an extend follows.
	Node policy.NodeID
	// Pages is the page count the engine states; it must equal
	// len(Hashes) (match, insert, extend) or is a lookup's answer.
	Pages int
	// Hashes are the pages' keys.
	Hashes []pagehash.Hash
	// Op, Stage and OK describe a done; Op and Pages a longest.
	Op    OpID
	Stage Stage
	OK    bool
	// Tier and OK describe a tier event.
	Tier int
}

// ErrContract marks an engine event that breaks the contract: a page count
// that is not the number of hashes, an extend of an unknown node, a
// release without a lock, a request event for an unknown request. The
// Machine's replicated state is unchanged.
var ErrContract = errors.New("event breaks the engine contract")

// EventError is a refused event: it names the event, its request, node and
// op.
type EventError struct {
	// Kind, Req, Node and Op identify the event.
	Kind EventKind
	Req  ReqID
	Node policy.NodeID
	Op   OpID
	// Err says what is wrong; it wraps ErrContract, ErrUnknownOp or
	// ErrStage.
	Err error
}

// Error names the event and what is wrong.
func (e *EventError) Error() string {
	s := "control: " + e.Kind.String()
	if e.Req != 0 || e.Kind.Replicated() && e.Kind != EvFlush && e.Kind != EvUpcoming {
		s += fmt.Sprintf(" req %d", e.Req)
	}
	if e.Node != 0 {
		s += fmt.Sprintf(" node %d", e.Node)
	}
	if e.Op != 0 || e.Kind == EvDone || e.Kind == EvLongest {
		s += fmt.Sprintf(" op %d", e.Op)
	}
	return s + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *EventError) Unwrap() error { return e.Err }

func (e Event) refuse(format string, args ...any) error {
	return &EventError{Kind: e.Kind, Req: e.Req, Node: e.Node, Op: e.Op, Err: fmt.Errorf(format, args...)}
}

// Apply applies one event. A refused event returns an *EventError and
// leaves the replicated state (and the Digest) unchanged.
func (m *Machine) Apply(e Event) error {
	switch e.Kind {
	case EvMatch, EvInsert, EvExtend, EvUpcoming:
		if e.Pages != len(e.Hashes) {
			return e.refuse("%d pages but %d hashes: %w", e.Pages, len(e.Hashes), ErrContract)
		}
	}
	var err error
	switch e.Kind {
	case EvMatch:
		err = m.match(e)
	case EvInsert, EvExtend:
		err = m.insert(e)
	case EvFinish:
		err = m.finish(e)
	case EvRelease:
		err = m.release(e)
	case EvFlush:
		err = m.flush()
	case EvDone:
		err = m.Done(e.Op, e.Stage, e.OK)
	case EvLongest:
		err = m.Longest(e.Op, e.Pages)
	case EvTier:
		err = m.SetTierUp(e.Tier, e.OK)
	case EvUpcoming:
		err = m.upcoming(e)
	default:
		return e.refuse("unknown event kind %d: %w", e.Kind, ErrContract)
	}
	if err == nil {
		return nil
	}
	// NB: declared here, not above: errors.As makes it escape, and an
	// event that succeeds must not pay for the allocation.
	var ee *EventError
	if !errors.As(err, &ee) {
		err = &EventError{Kind: e.Kind, Req: e.Req, Node: e.Node, Op: e.Op, Err: err}
	}
	return err
}

// match looks the request's key up: the path is locked for the request, a
// suffix resident only in L2 is loaded back into L1, write-through-
// selective backs up nodes hit often enough, and a miss starts a reload
// lookup when a Store is below the slab.
func (m *Machine) match(e Event) error {
	r := m.reqs[e.Req]
	if r != nil && r.held {
		return e.refuse("request is held for a reload: %w", ErrContract)
	}
	path, pages := m.tree.MatchHashes(e.Hashes, m.pathB)
	m.pathB = path[:0]
	if err := m.settle(); err != nil {
		return err
	}
	if r == nil {
		r = &request{}
		m.reqs[e.Req] = r
	}
	var last *radix.Node
	if len(path) > 0 {
		last = path[len(path)-1]
	}
	if err := m.moveLock(r, last); err != nil {
		return err
	}
	// NB: path is m.pathB's array; nothing below walks the tree with it
	// again (only match, applyReload and upcoming do), so it is used as is.
	nodes := path
	if m.opts.WritePolicy == WriteThroughSelective {
		for _, n := range nodes {
			k := m.marks.Get(n.ID())
			if n.Residency().Has(1) && k.l2 == 0 && n.Hits() >= m.opts.SelectiveHits {
				m.backup(n, false, e.Req)
			}
		}
	}
	res := MatchResult{Req: e.Req, Pages: pages, L1: radix.ResidentPages(nodes, 1)}
	if last != nil {
		res.Node = last.ID()
	}
	res.L2 = m.loadBack(e.Req, nodes)
	if pages < len(e.Hashes) {
		m.startReload(e.Req, r, e.Hashes, pages, path)
	}
	res.Held = r.held
	m.out.matches = append(m.out.matches, res)
	return nil
}

// moveLock puts the request's lock on n (nil: none), locking before
// unlocking so the shared prefix never becomes evictable in between.
func (m *Machine) moveLock(r *request, n *radix.Node) error {
	if n == r.lock {
		return nil
	}
	if n != nil {
		if err := m.tree.Lock(n); err != nil {
			return fmt.Errorf("control: lock node %d: %w", n.ID(), err)
		}
	}
	if r.lock != nil && !r.lock.Removed() {
		if err := m.tree.Unlock(r.lock); err != nil {
			return fmt.Errorf("control: unlock node %d: %w", r.lock.ID(), err)
		}
	}
	r.lock = n
	return nil
}

// insert caches a request's key (insert: from the root; extend: after a
// node, a chunk of a chunked prefill). The request's lock moves to the
// key's last node; the new pages get L1 pages (admission) and, under
// write_through, a backup.
func (m *Machine) insert(e Event) error {
	if len(e.Hashes) == 0 {
		return e.refuse("no pages: %w", ErrContract)
	}
	r := m.reqs[e.Req]
	if r != nil && r.held {
		return e.refuse("request is held for a reload: %w", ErrContract)
	}
	var from *radix.Node
	if e.Kind == EvExtend {
		if from = m.tree.Node(e.Node); from == nil {
			return e.refuse("extend of unknown node %d: %w", e.Node, ErrContract)
		}
	}
	if r == nil {
		r = &request{}
		m.reqs[e.Req] = r
	}
	// NB: the tree copies the pages it adds, not the whole key: the
	// event's hashes are the caller's, and most of a key is usually
	// present already.
	var last *radix.Node
	var added int
	if from != nil {
		var err error
		if last, added, err = m.tree.Extend(from, e.Hashes); err != nil {
			return fmt.Errorf("control: %w", err)
		}
	} else {
		last, added = m.tree.InsertHashes(e.Hashes)
	}
	if err := m.settle(); err != nil {
		return err
	}
	if last == m.tree.Root() {
		last = nil
	}
	if err := m.moveLock(r, last); err != nil {
		return err
	}
	if added == 0 {
		return nil
	}
	// The new pages are the leaf last: admit them to L1.
	k := m.marks.Get(last.ID())
	if !m.admitL1(int64(added), e.Req, last.ID()) {
		// Not cached: the leaf leaves the tree and the lock goes back up.
		parent := last.Parent()
		if parent == m.tree.Root() {
			parent = nil
		}
		if err := m.moveLock(r, parent); err != nil {
			return err
		}
		if _, err := m.tree.Prune(last); err != nil {
			return fmt.Errorf("control: drop unadmitted node %d: %w", last.ID(), err)
		}
		return m.settle()
	}
	m.setL1(last.ID(), k, m.reserveL1(last.ID(), int64(added)))
	l1, err := m.l1.AppendRanges(nil, k.l1)
	if err != nil {
		return fmt.Errorf("control: L1 object of node %d: %w", last.ID(), err)
	}
	m.out.placements = append(m.out.placements, Placement{Req: e.Req, Node: last.ID(), L1: l1, Depth: last.Depth()})
	if m.opts.WritePolicy == WriteThrough {
		m.backup(last, false, e.Req)
	}
	return nil
}

// finish reports a finished request to the evictor and drops its hold.
func (m *Machine) finish(e Event) error {
	r := m.reqs[e.Req]
	if r == nil {
		return e.refuse("unknown request: %w", ErrContract)
	}
	m.tree.Finished(r.lock, policy.RequestInfo{})
	if r.held {
		m.dropWaiter(e.Req, r)
	}
	return nil
}

// release drops the request's lock (if it holds one) and forgets the
// request; a request the Machine does not know never took a lock.
func (m *Machine) release(e Event) error {
	r := m.reqs[e.Req]
	if r == nil {
		return e.refuse("release without a lock (unknown or already released request): %w", ErrContract)
	}
	if r.lock != nil {
		if r.lock.Removed() {
			return fmt.Errorf("control: release req %d: locked node %d left the tree (bug)", e.Req, r.lock.ID())
		}
		if err := m.tree.Unlock(r.lock); err != nil {
			return fmt.Errorf("control: %w", err)
		}
	}
	if r.held {
		m.dropWaiter(e.Req, r)
	}
	delete(m.reqs, e.Req)
	return nil
}

// flush drops the whole cache and returns the Machine to a new one's
// state. It needs a quiet Machine — no op in flight, no request — or it is
// skipped (undrained) and the engine retries: both facts are replicated,
// so every rank skips or flushes alike.
func (m *Machine) flush() error {
	if m.ops.Len() > 0 || len(m.reqs) > 0 {
		m.skip(Skip{Reason: SkipUndrained, Where: "flush", Pages: m.ops.Len()})
		return nil
	}
	m.count(cFlush)
	return m.reset()
}

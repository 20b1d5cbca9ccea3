// Package pagestore is the state of the page-store door kvtier.store.v1
// (api/kvtier/store/v1): the L2 slab's page slots, the entries that name
// them, the leases of clients' gets and sets, eviction by the stack's
// policy and write-through to the stack's first store. docs/store-api.md
// gives the call sequence.
//
// One Door decides for every client of the node: one `kvtier serve`
// process holds it, and nothing of it is replicated (unlike the engine
// door's Machines, which every rank of a group computes alike). Its state
// is guarded by one mutex that is never held across store I/O, CRC
// passes or waits.
//
// A page is one slot of the slab: one span per payload kind of the stack
// config, placed by placement.PlanLayout. An entry goes
//
//	reserved (a BatchSet lease; never readable)
//	  -> committed (CRC32C per span taken at Commit; readable)
//	  -> evictable (unpinned, and its write-through Put reached
//	     AckGathered or failed)
//	  -> evicted (the stack's Evictor v1 picks it when a slot is needed)
//
// A slot is reused only when no client may still be reading it (no pin),
// no store may still be reading it (no Put before AckGathered) and no
// store may still be writing it (a reload that timed out keeps its slots
// until the store's Get returns).
package pagestore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kvtier/kvtier/api/storev1"
	"github.com/kvtier/kvtier/host/placement"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/tiers"
)

// Limits bound what clients may ask; zero fields take the defaults.
type Limits struct {
	// MaxBatchPages bounds the keys of one call (default 1024).
	MaxBatchPages int
	// MaxKeyBytes bounds one key (default 1024).
	MaxKeyBytes int
	// Lease ends a get's pins and a set's reservations this long after
	// the call (default 30 s).
	Lease time.Duration
	// SessionTTL closes a session without a call for this long (default
	// 10 min: an SGLang rank may be idle for long; a dropped connection
	// ends its sessions at once).
	SessionTTL time.Duration
	// DefaultDeadline bounds a BatchGet's reloads that name none (default
	// 2 s, SGLang's base prefetch timeout); MaxDeadline is the most one
	// may name (default 30 s).
	DefaultDeadline, MaxDeadline time.Duration
}

func (l *Limits) defaults() {
	if l.MaxBatchPages <= 0 {
		l.MaxBatchPages = 1024
	}
	if l.MaxKeyBytes <= 0 {
		l.MaxKeyBytes = 1024
	}
	if l.Lease <= 0 {
		l.Lease = 30 * time.Second
	}
	if l.SessionTTL <= 0 {
		l.SessionTTL = 10 * time.Minute
	}
	if l.DefaultDeadline <= 0 {
		l.DefaultDeadline = 2 * time.Second
	}
	if l.MaxDeadline <= 0 {
		l.MaxDeadline = 30 * time.Second
	}
	l.DefaultDeadline = min(l.DefaultDeadline, l.MaxDeadline)
}

// Options configure a Door.
type Options struct {
	// Slab is the door's L2 slab; the door owns its whole page space.
	Slab tiers.Slab
	// Payload is the stack's payload geometry: every page has one span
	// of each kind, and Register refuses other kinds.
	Payload tiers.PayloadGeometry
	// Store is the stack's first store (written through, reloaded from),
	// or nil for a slab-only door; StoreName names it in Register.
	Store     tiers.Store
	StoreName string
	// NewEvictor builds the stack's eviction policy (required).
	NewEvictor func() (policy.Evictor, error)
	// BootID is reported in every reply (required).
	BootID string
	// StateDir, when set, keeps the namespaces' generations (Clear) in a
	// file there, so a restart does not bring cleared pages back from
	// the store. Empty: in memory only.
	StateDir string
	Limits   Limits
	// SkipVerify turns off the CRC check of L2 hits at BatchGet (on by
	// default; docs/perf.md gives its cost). Pages are still checksummed
	// at Commit and reloads stay verified by the store.
	SkipVerify bool
	// ConnOf returns the connection a call came over (0: unknown);
	// ConnEnded(id) then ends that connection's sessions.
	ConnOf func(ctx context.Context) uint64
	// Logger receives the door's lines (nil: discarded).
	Logger *slog.Logger
	// StopTimeout bounds Stop's wait for calls and reloads in flight
	// (default 10 s).
	StopTimeout time.Duration
}

// entry states.
const (
	stReserved uint8 = iota + 1
	// stCommitting: committed by its client, its checksum being taken
	// off the Commit call; a get waits for ready, a set finds it EXISTS.
	stCommitting
	stCommitted
)

// entry is one page of the door: a slot and what the door knows of it.
type entry struct {
	hash  pagehash.Hash
	slot  int32
	state uint8
	// dead: out of the map (evicted, corrupt, abandoned); the slot is
	// freed once pins and putPending reach 0.
	dead bool
	// pins counts the get leases (and in-flight verifications) holding
	// it; putPending the kinds whose write-through has not yet reached
	// AckGathered or AckFailed.
	pins, putPending int32
	crc              []uint32
	// ready is closed when a stCommitting entry's checksum is taken (it
	// is then stCommitted).
	ready chan struct{}
	// node is its id in the evictor (0: not inserted); evictable what
	// the evictor was last told.
	node      policy.NodeID
	evictable bool
	hits      uint64
	last      uint64
}

// nsState is one namespace's generation: keys hash it in, so Clear is a
// bump.
type nsState struct {
	id  [32]byte
	gen uint64 // guarded by Door.mu
	// cache maps key strings to page keys of generation cacheGen
	// (guarded by Door.mu).
	cache    map[string]pagehash.Hash
	cacheGen uint64
}

type session struct {
	id     string
	client string
	ns     *nsState
	conn   uint64
	last   time.Time
	leases map[uint64]*lease
}

// lease is one BatchGet's pins or one BatchSet's reservations.
type lease struct {
	id      uint64
	ses     *session
	set     bool
	expires time.Time
	ended   bool
	// get: the pinned entries (nil where dropped) and slots pinned
	// outside the map (a reload of a key another client is setting).
	pinned   []*entry
	detached []int32
	// set: one per key of the BatchSet.
	res    []*entry
	status []pb.SetStatus
	// chk is the check of a check_at_release get's L2 hits, running
	// while the client copies; Release waits for it.
	chk *pendingCheck
}

// pendingCheck is a check_at_release get's CRC check of its L2 hits.
type pendingCheck struct {
	done chan struct{}
	// corrupt: the positions of the hits that failed (set before done
	// is closed); void: the lease ended before the check finished, so
	// its pins were gone and nothing is confirmed.
	corrupt []uint32
	void    bool
}

// counters are the door's Stats.
type counters struct {
	existsCalls, getPages, hitL2, hitL3, miss, corrupt, timeout       uint64
	existsWaits                                                       uint64 // BatchExists calls that waited on reloads
	setPages, stored, exists, noSpace, readBytes, writtenBytes, evict uint64
	verifyFailures, putFailures                                       uint64
	prefetch, prefetchSkipped                                         uint64
}

// putItem is one kind of one page in a write-through Put batch.
type putItem struct {
	e    *entry
	done bool // gathered or failed: putPending already decremented
	term bool
}

type putBatch struct {
	items []putItem
	terms int
}

// quarantined is a slot freed by an expired set lease: the client may be
// alive and still writing it, so it is reused only after another lease.
type quarantined struct {
	slot  int32
	until time.Time
}

// Door is the page-store door's state. Its methods implement
// storev1.StoreServer; they are safe for concurrent use.
type Door struct {
	pb.UnimplementedStoreServer
	// afterStartCheck, set by tests only, runs in a check_at_release
	// BatchGet right after its check started (to order the check against
	// the rest of the call).
	afterStartCheck func(*pendingCheck)
	opt             Options
	log             *slog.Logger
	kinds           []tiers.PayloadSpec
	pageBytes       int64
	nslots          int
	spans           []tiers.Span // slot*len(kinds)+kind
	views           [][]byte     // the same, as bytes of the slab
	// storeKeepsSums: the store stores the checksums Commit hands it with
	// each put as given (tiers.SumKeeper), so a page changed in the slab
	// before the store gathered it reads back from the store as a miss,
	// and the door need not check the slab again at AckGathered.
	storeKeepsSums bool

	mu         sync.Mutex
	free       []int32
	quarantine []quarantined
	entries    map[pagehash.Hash]*entry
	nodes      map[policy.NodeID]*entry
	ev         policy.Evictor
	clock      uint64
	nextNode   policy.NodeID
	sessions   map[string]*session
	leases     map[uint64]*lease
	nextLease  uint64
	spaces     map[[32]byte]*nsState
	puts       map[tiers.BatchID]*putBatch
	early      map[tiers.BatchID][]tiers.Ack
	gathered   []*entry // pages gathered by the store, to verify
	checking   int      // pages taken from gathered, being verified
	loading    int      // slots held by reloads in flight
	// reloading names the reload in flight of a page (the latest, when a
	// BatchGet reloads a page a prefetch is also reloading).
	reloading map[pagehash.Hash]*load
	// commits are the Commits whose checksums are being taken: their
	// pages hold slots that become evictable when done is closed.
	commits map[chan struct{}]struct{}
	st      counters
	closed  bool
	genMu   sync.Mutex // serialises writes of the generations file

	stop chan struct{}
	wg   sync.WaitGroup
	busy sync.WaitGroup // calls and reloads that touch slab bytes
}

// Open builds a Door over opt.Slab's whole page space and starts its
// janitor (leases, sessions) and, with a store, its ack drainer.
func Open(opt Options) (*Door, error) {
	if opt.Slab == nil {
		return nil, fmt.Errorf("page store: no slab")
	}
	if opt.NewEvictor == nil {
		return nil, fmt.Errorf("page store: no eviction policy")
	}
	if opt.BootID == "" {
		return nil, fmt.Errorf("page store: no boot id")
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	opt.Limits.defaults()
	if opt.StopTimeout <= 0 {
		opt.StopTimeout = 10 * time.Second
	}
	ev, err := opt.NewEvictor()
	if err != nil {
		return nil, fmt.Errorf("page store: eviction policy: %w", err)
	}
	g := opt.Slab.Geometry()
	layout, err := placement.PlanLayout(g.Slabs, opt.Payload, 4096)
	if err != nil {
		return nil, fmt.Errorf("page store: slab layout: %w", err)
	}
	d := &Door{opt: opt, log: opt.Logger, kinds: opt.Payload.Kinds, ev: ev,
		entries: map[pagehash.Hash]*entry{}, nodes: map[policy.NodeID]*entry{}, sessions: map[string]*session{},
		leases: map[uint64]*lease{}, spaces: map[[32]byte]*nsState{}, puts: map[tiers.BatchID]*putBatch{},
		early: map[tiers.BatchID][]tiers.Ack{}, reloading: map[pagehash.Hash]*load{}, stop: make(chan struct{})}
	for _, k := range d.kinds {
		d.pageBytes += k.PageBytes
	}
	if sk, ok := opt.Store.(tiers.SumKeeper); ok {
		d.storeKeepsSums = sk.KeepsPutSums()
	}
	d.nslots = int(layout.Kinds[0].Pages())
	for _, kl := range layout.Kinds[1:] {
		d.nslots = min(d.nslots, int(kl.Pages()))
	}
	if d.nslots > 1<<31-1 {
		d.nslots = 1<<31 - 1
	}
	nk := len(d.kinds)
	d.spans = make([]tiers.Span, d.nslots*nk)
	d.views = make([][]byte, d.nslots*nk)
	for k, kl := range layout.Kinds {
		slot := 0
		for _, r := range kl.Regions {
			for p := int64(0); p < r.Pages && slot < d.nslots; p++ {
				sp := tiers.Span{Slab: r.Slab, Offset: r.Offset + p*kl.PageBytes, Length: kl.PageBytes}
				b, err := opt.Slab.Bytes(sp)
				if err != nil {
					return nil, fmt.Errorf("page store: slot %d kind %s: %w", slot, kl.Name, err)
				}
				d.spans[slot*nk+k], d.views[slot*nk+k] = sp, b
				slot++
			}
		}
	}
	d.free = make([]int32, d.nslots)
	for i := range d.free {
		// Popped from the end: slot 0 first.
		d.free[i] = int32(d.nslots - 1 - i)
	}
	if err := d.loadGenerations(); err != nil {
		return nil, err
	}
	d.wg.Add(1)
	go d.janitor()
	if opt.Store != nil {
		d.wg.Add(1)
		go d.drainAcks()
	}
	return d, nil
}

// Stop ends every session (pins dropped, reservations freed) and stops
// the door's goroutines. Reloads in flight finish on their own; the
// caller closes the stack (stores, then the slab) afterwards.
func (d *Door) Stop() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	for _, s := range d.sessions {
		d.endSession(s)
	}
	d.mu.Unlock()
	close(d.stop)
	d.wg.Wait()
	// NB: calls and reloads in flight read and write slab bytes; the
	// caller unmaps the slab after Stop, so wait for them (bounded: a
	// store that never returns must not hang the stop).
	done := make(chan struct{})
	go func() { d.busy.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(d.opt.StopTimeout):
		return fmt.Errorf("page store: calls or reloads still touch the slab %s after the stop: %w", d.opt.StopTimeout, ErrBusy)
	}
}

// ErrBusy: Stop gave up waiting for work that touches the slab; the
// caller must not unmap it.
var ErrBusy = errors.New("slab still in use")

// enter admits a call that touches slab bytes; leave ends it.
func (d *Door) enter() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return status.Errorf(codes.Unavailable, "serve is stopping")
	}
	d.busy.Add(1)
	return nil
}

func (d *Door) leave() { d.busy.Done() }

// Slots is the number of pages the slab holds.
func (d *Door) Slots() int { return d.nslots }

// ConnEnded ends every session registered over connection id (the
// client's process died or closed its channel): its leases end at once.
func (d *Door) ConnEnded(id uint64) {
	if id == 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.sessions {
		if s.conn == id {
			d.log.Info("kvtier store: session ended", "session", s.id, "client", s.client, "why", "disconnected")
			d.endSession(s)
		}
	}
}

func newSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// errUnknownSession is the NotFound a call on a session that is not open
// gets: the client registers again.
var errUnknownSession = errors.New("session is not open here (serve restarted or the session ended): register again")

// span returns slot's span of kind k.
func (d *Door) span(slot int32, k int) tiers.Span { return d.spans[int(slot)*len(d.kinds)+k] }

func (d *Door) view(slot int32, k int) []byte { return d.views[int(slot)*len(d.kinds)+k] }

// --- slot and entry bookkeeping; every function below runs under d.mu.

// alloc returns a free slot, evicting by the policy when none is free;
// -1 when every slot is pinned, reserved, loading or being written below.
func (d *Door) alloc() int32 {
	for len(d.free) == 0 {
		id, ok := d.ev.Victim()
		if !ok {
			return -1
		}
		e := d.nodes[id]
		if e == nil || !e.evictable {
			// The policy's view and ours disagree: tell it, and stop
			// rather than loop.
			d.log.Error("kvtier store: eviction policy named a page that is not evictable", "node", id)
			d.ev.Remove(id)
			return -1
		}
		d.st.evict++
		d.drop(e)
	}
	s := d.free[len(d.free)-1]
	d.free = d.free[:len(d.free)-1]
	return s
}

// drop takes e out of the map and the evictor; its slot is freed when
// nothing holds it.
func (d *Door) drop(e *entry) {
	if e.dead {
		return
	}
	e.dead = true
	if cur := d.entries[e.hash]; cur == e {
		delete(d.entries, e.hash)
	}
	if e.node != 0 {
		d.ev.Remove(e.node)
		delete(d.nodes, e.node)
		e.node, e.evictable = 0, false
	}
	d.maybeFree(e)
}

func (d *Door) maybeFree(e *entry) {
	if e.dead && e.pins == 0 && e.putPending == 0 && e.slot >= 0 {
		d.free = append(d.free, e.slot)
		e.slot = -1
	}
}

func (d *Door) tick() uint64 { d.clock++; return d.clock }

// insert adds a committed entry to the map and the evictor.
func (d *Door) insert(e *entry) {
	d.entries[e.hash] = e
	d.nextNode++
	e.node = d.nextNode
	d.nodes[e.node] = e
	t := d.tick()
	e.last = t
	d.ev.Insert(policy.NodeInfo{ID: e.node, Time: t, LastAccess: t, Pages: 1})
	d.updateEvictable(e)
}

func (d *Door) hit(e *entry) {
	t := d.tick()
	e.hits++
	d.ev.Hit(policy.NodeInfo{ID: e.node, Time: t, LastAccess: e.last, Hits: e.hits, Pages: 1})
	e.last = t
}

func (d *Door) updateEvictable(e *entry) {
	if e.node == 0 {
		return
	}
	want := !e.dead && e.state == stCommitted && e.pins == 0 && e.putPending == 0
	if want != e.evictable {
		e.evictable = want
		d.ev.SetEvictable(e.node, want)
	}
}

func (d *Door) unpin(e *entry) {
	e.pins--
	if e.dead {
		d.maybeFree(e)
		return
	}
	d.updateEvictable(e)
}

// endLease drops a lease's pins and frees its uncommitted reservations.
// expired: the client may still be writing its reserved spans, so those
// slots wait another lease before reuse.
func (d *Door) endLease(l *lease, expired bool) {
	if l.ended {
		return
	}
	l.ended = true
	delete(d.leases, l.id)
	delete(l.ses.leases, l.id)
	for i, e := range l.pinned {
		if e != nil {
			d.unpin(e)
			l.pinned[i] = nil
		}
	}
	d.free = append(d.free, l.detached...)
	l.detached = nil
	for i, e := range l.res {
		if e == nil {
			continue
		}
		l.res[i] = nil
		d.abandon(e, expired)
	}
}

// abandon frees a reservation that was never committed: it was never
// readable, and now it is gone.
func (d *Door) abandon(e *entry, quarantine bool) {
	if cur := d.entries[e.hash]; cur == e {
		delete(d.entries, e.hash)
	}
	e.dead = true
	if quarantine {
		d.quarantine = append(d.quarantine, quarantined{slot: e.slot, until: time.Now().Add(d.opt.Limits.Lease)})
	} else {
		d.free = append(d.free, e.slot)
	}
	e.slot = -1
}

func (d *Door) endSession(s *session) {
	for _, l := range s.leases {
		d.endLease(l, false)
	}
	delete(d.sessions, s.id)
}

// janitor ends expired leases and silent sessions, and returns
// quarantined slots.
func (d *Door) janitor() {
	defer d.wg.Done()
	every := max(10*time.Millisecond, min(d.opt.Limits.Lease, d.opt.Limits.SessionTTL)/8)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case now := <-t.C:
			d.sweep(now)
		}
	}
}

// sweep runs one pass of the janitor at now.
func (d *Door) sweep(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	// NB: the quarantine first: slots quarantined below wait a lease
	// from now.
	q := d.quarantine[:0]
	for _, x := range d.quarantine {
		if now.After(x.until) {
			d.free = append(d.free, x.slot)
		} else {
			q = append(q, x)
		}
	}
	d.quarantine = q
	for _, l := range d.leases {
		if now.After(l.expires) {
			d.log.Warn("kvtier store: lease expired", "session", l.ses.id, "lease", l.id, "set", l.set)
			d.endLease(l, l.set)
		}
	}
	for _, s := range d.sessions {
		if now.Sub(s.last) > d.opt.Limits.SessionTTL {
			d.log.Info("kvtier store: session ended", "session", s.id, "client", s.client, "why", "silent past the session ttl")
			d.endSession(s)
		}
	}
}

// drainAcks applies the store's write-through acks: a page's slot may be
// evicted once every kind of its Put was gathered (or failed).
func (d *Door) drainAcks() {
	defer d.wg.Done()
	var acks []tiers.Ack
	for {
		select {
		case <-d.stop:
			return
		case <-d.opt.Store.AckReady():
		}
		acks = d.opt.Store.DrainAcks(acks[:0])
		if len(acks) == 0 {
			continue
		}
		d.mu.Lock()
		for _, a := range acks {
			b := d.puts[a.Batch]
			if b == nil {
				// Put has not returned its id to us yet.
				d.early[a.Batch] = append(d.early[a.Batch], a)
				continue
			}
			d.applyAck(a.Batch, b, a)
		}
		check := d.takeGathered()
		d.mu.Unlock()
		d.checkGathered(check)
	}
}

// takeGathered returns (under d.mu) the entries whose every kind the
// store gathered: their last putPending count is the check below.
func (d *Door) takeGathered() []*entry {
	c := d.gathered
	d.gathered = nil
	d.checking += len(c)
	return c
}

// checkGathered verifies, for a store that does not keep the put's sums
// (a plugin, whose protocol does not carry them yet; a store that
// predates them), once the store copied a page out of the slab,
// that the slab still held the committed bytes: a client that wrote into
// a committed span before the store gathered it would otherwise have
// given the store wrong bytes under a valid checksum of the store's own.
// A page that fails is dropped from the slab and deleted from the store
// (a miss, never wrong bytes); then its slot may go.
func (d *Door) checkGathered(es []*entry) {
	if len(es) == 0 {
		return
	}
	bad := make([]bool, len(es))
	d.forPages(len(es), func(i int) { bad[i] = !d.verify(es[i].slot, es[i].crc) })
	var del []tiers.Key
	d.mu.Lock()
	for i, e := range es {
		if bad[i] {
			if !e.dead { // else a get's check counted and dropped it
				d.st.corrupt++
				d.st.verifyFailures++
				d.drop(e)
			}
			d.log.Error("kvtier store: a page changed in the slab before the store gathered it: dropped here and from the store", "key", e.hash.Short(), "slot", e.slot)
			for k := range d.kinds {
				del = append(del, tiers.Key{Hash: e.hash, Kind: tiers.PayloadKind(k)})
			}
		}
		e.putPending--
		if e.dead {
			d.maybeFree(e)
		} else {
			d.updateEvictable(e)
		}
	}
	d.checking -= len(es)
	d.mu.Unlock()
	if len(del) > 0 {
		if err := d.opt.Store.Delete(context.Background(), del); err != nil {
			d.log.Error("kvtier store: deleting pages that changed before the store gathered them failed", "pages", len(del)/len(d.kinds), "err", err)
		}
	}
}

func (d *Door) applyAck(id tiers.BatchID, b *putBatch, a tiers.Ack) {
	if a.Index < 0 || a.Index >= len(b.items) {
		d.log.Error("kvtier store: ack for an item the batch does not have", "batch", id, "index", a.Index)
		return
	}
	it := &b.items[a.Index]
	switch a.Stage {
	case tiers.AckGathered, tiers.AckFailed, tiers.AckDurable:
		if !it.done {
			it.done = true
			if it.e.putPending == 1 && a.Stage != tiers.AckFailed && !d.storeKeepsSums {
				// The last kind is gathered: checkGathered takes the
				// last count after verifying the slab's bytes. A dead
				// entry too (a get's check dropped it meanwhile): its
				// slot is kept until then, and if the store gathered
				// changed bytes they must be deleted from it.
				// NB: not for a store that keeps the put's sums: what it
				// gathered is stored under Commit's checksum, so changed
				// bytes are a miss at its every read; the slab's own copy
				// is checked by the gets that hit it.
				d.gathered = append(d.gathered, it.e)
				break
			}
			it.e.putPending--
			if it.e.dead {
				d.maybeFree(it.e)
			} else {
				d.updateEvictable(it.e)
			}
		}
	}
	if a.Stage == tiers.AckFailed {
		d.st.putFailures++
	}
	if (a.Stage == tiers.AckFailed || a.Stage == tiers.AckDurable) && !it.term {
		it.term = true
		b.terms++
		if b.terms == len(b.items) {
			delete(d.puts, id)
		}
	}
}

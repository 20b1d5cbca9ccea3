// Package memstore is kvtier's in-process reference Store v1: content-
// addressed pages in process memory under a byte budget, least recently used
// evicted first.
//
// It is the yardstick other stores are measured against (the plugin
// benchmark compares a memstore behind a plugin with one in process) and the
// simplest complete example of the Store v1 contract. It keeps nothing across
// restarts, so cold start "load" finds nothing. It must never decide what the
// cache contains beyond its own budget: the host decides, memstore obeys and
// evicts only to stay within its capacity.
package memstore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/registry"
	"github.com/kvtier/kvtier/tiers"
)

// Name is memstore's registered name.
const Name = "memstore"

// DefaultCapacity is the byte budget when the config gives none.
const DefaultCapacity = 1 << 30

// Config is memstore's YAML config.
type Config struct {
	// Capacity is the byte budget for stored payload bytes ("8GiB").
	Capacity quantity.Size `yaml:"capacity"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config { return Config{Capacity: DefaultCapacity} }

// MaxCapacity bounds capacity: more process memory than any machine has,
// so a larger value is a unit mistake.
const MaxCapacity = 64 * quantity.TiB

// Validate checks the config. Its errors are registry.FieldErrors, so the
// stack loader reports the field's line.
func (c *Config) Validate() error {
	if c.Capacity <= 0 {
		return registry.FieldErrorf("capacity", "memstore: capacity must be positive, got %s", c.Capacity)
	}
	if c.Capacity > MaxCapacity {
		return registry.FieldErrorf("capacity", "memstore: capacity %s is more than %s, more memory than any machine has", c.Capacity, MaxCapacity)
	}
	return nil
}

// Register adds memstore to r as a Store v1.
func Register(r *tiers.Registry) error {
	return r.Stores.Register(registry.Registration[tiers.Factory[tiers.Store]]{
		Type:      tiers.StoreV1,
		Name:      Name,
		Doc:       "content-addressed pages in process memory under a byte budget (LRU); not persistent",
		NewConfig: registry.NewConfigOf(DefaultConfig),
		Factory: func(ctx context.Context, env tiers.Env, cfg any) (tiers.Store, error) {
			c, err := registry.ConfigAs(Name, cfg, DefaultConfig)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", err, tiers.ErrInvalid)
			}
			// NB: a failed open must return a nil interface, not one
			// holding a nil pointer.
			m, err := Open(env, c)
			if err != nil {
				return nil, err
			}
			return m, nil
		},
	})
}

// entry is one stored payload page, a node of the LRU list.
type entry struct {
	key        tiers.Key
	data       []byte
	prev, next *entry // LRU list: head = most recent
}

// Store is the in-memory Store v1.
type Store struct {
	payload tiers.PayloadGeometry
	slab    tiers.Slab

	mu       sync.Mutex
	closed   bool
	capacity int64
	used     int64
	pages    map[tiers.Key]*entry
	head     entry            // sentinel of the circular LRU list
	free     map[int][][]byte // recycled page buffers by length
	nextID   tiers.BatchID
	stats    tiers.StoreStats

	acks  tiers.AckQueue
	ready chan struct{}
}

var _ tiers.Store = (*Store)(nil)

// Open returns an empty store. env.Slab is required; env.ColdStart is
// accepted but there is never anything to load.
func Open(env tiers.Env, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := env.Validate(); err != nil {
		return nil, fmt.Errorf("memstore: %w", err)
	}
	if env.Slab == nil {
		return nil, fmt.Errorf("memstore: env has no slab to read and write pages through")
	}
	s := &Store{
		payload:  env.Payload,
		slab:     env.Slab,
		capacity: int64(cfg.Capacity),
		pages:    make(map[tiers.Key]*entry),
		free:     make(map[int][][]byte),
		ready:    tiers.NewAckReady(),
	}
	s.head.prev, s.head.next = &s.head, &s.head
	s.stats.CapacityBytes = int64(cfg.Capacity)
	if env.ColdStart == tiers.ColdStartLoad {
		env.Logger.Info("memstore is not persistent: cold start load finds nothing")
	}
	return s, nil
}

// span resolves and checks one request's span against its payload kind.
func (s *Store) span(k tiers.Key, sp tiers.Span) ([]byte, error) {
	size, err := s.payload.PageBytes(k.Kind)
	if err != nil {
		return nil, err
	}
	if sp.Length != size {
		return nil, fmt.Errorf("span %+v for %s: length must be page_bytes %d: %w", sp, k, size, tiers.ErrInvalid)
	}
	b, err := s.slab.Bytes(sp)
	if err != nil {
		return nil, fmt.Errorf("span for %s: %w", k, err)
	}
	return b, nil
}

// Put stores the batch synchronously and queues both acks of every item.
func (s *Store) Put(_ context.Context, batch []tiers.PutRequest) (tiers.BatchID, error) {
	srcs := make([][]byte, len(batch))
	for i, r := range batch {
		b, err := s.span(r.Key, r.Src)
		if err != nil {
			return 0, fmt.Errorf("memstore put item %d: %w", i, err)
		}
		srcs[i] = b
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return 0, tiers.ErrClosed
	}
	if len(batch) == 0 {
		s.mu.Unlock()
		return 0, nil
	}
	s.nextID++
	id := s.nextID
	acks := make([]tiers.Ack, 0, 2*len(batch))
	for i, r := range batch {
		size := int64(len(srcs[i]))
		s.stats.Puts++
		if e, ok := s.pages[r.Key]; ok {
			// Content-addressed: the same key is the same bytes.
			s.moveToFront(e)
			acks = append(acks, tiers.Ack{Batch: id, Index: i, Stage: tiers.AckGathered}, tiers.Ack{Batch: id, Index: i, Stage: tiers.AckDurable})
			continue
		}
		if size > s.capacity {
			s.stats.PutFailures++
			acks = append(acks, tiers.Ack{Batch: id, Index: i, Stage: tiers.AckFailed,
				Err: fmt.Errorf("memstore put %s: page of %d bytes exceeds capacity %d: %w", r.Key, size, s.capacity, tiers.ErrFull)})
			continue
		}
		for s.used+size > s.capacity {
			s.evictOldest()
		}
		e := &entry{key: r.Key, data: s.buffer(len(srcs[i]))}
		copy(e.data, srcs[i])
		s.pages[r.Key] = e
		s.pushFront(e)
		s.used += size
		acks = append(acks, tiers.Ack{Batch: id, Index: i, Stage: tiers.AckGathered}, tiers.Ack{Batch: id, Index: i, Stage: tiers.AckDurable})
	}
	s.mu.Unlock()
	s.acks.Push(s.ready, acks...)
	return id, nil
}

// Get copies stored pages into the destination spans.
func (s *Store) Get(_ context.Context, batch []tiers.GetRequest, results []error) error {
	if len(results) != len(batch) {
		return fmt.Errorf("memstore get: %d results for %d requests: %w", len(results), len(batch), tiers.ErrInvalid)
	}
	dsts := make([][]byte, len(batch))
	for i, r := range batch {
		b, err := s.span(r.Key, r.Dst)
		if err != nil {
			return fmt.Errorf("memstore get item %d: %w", i, err)
		}
		dsts[i] = b
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return tiers.ErrClosed
	}
	for i, r := range batch {
		e, ok := s.pages[r.Key]
		if !ok {
			s.stats.Misses++
			results[i] = fmt.Errorf("memstore %s: not stored: %w", r.Key, tiers.ErrMiss)
			continue
		}
		copy(dsts[i], e.data)
		s.moveToFront(e)
		s.stats.Hits++
		results[i] = nil
	}
	return nil
}

// LongestPrefix counts the leading hashes of chain stored for kind.
func (s *Store) LongestPrefix(_ context.Context, kind tiers.PayloadKind, chain []pagehash.Hash) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, tiers.ErrClosed
	}
	for i, h := range chain {
		if _, ok := s.pages[tiers.Key{Hash: h, Kind: kind}]; !ok {
			return i, nil
		}
	}
	return len(chain), nil
}

// Delete removes keys.
func (s *Store) Delete(_ context.Context, keys []tiers.Key) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return tiers.ErrClosed
	}
	for _, k := range keys {
		if e, ok := s.pages[k]; ok {
			s.remove(e)
		}
	}
	return nil
}

// Touch makes keys most recently used.
func (s *Store) Touch(_ context.Context, keys []tiers.Key) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return tiers.ErrClosed
	}
	for _, k := range keys {
		if e, ok := s.pages[k]; ok {
			s.moveToFront(e)
		}
	}
	return nil
}

// DrainAcks appends queued acks to dst.
func (s *Store) DrainAcks(dst []tiers.Ack) []tiers.Ack {
	return s.acks.Drain(dst)
}

// AckReady is signalled when acks are queued.
func (s *Store) AckReady() <-chan struct{} { return s.ready }

// Stats returns counters.
func (s *Store) Stats() tiers.StoreStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Pages = int64(len(s.pages))
	st.Bytes = s.used
	return st
}

// Close drops every page. Calling it twice returns ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return tiers.ErrClosed
	}
	s.closed = true
	s.pages = nil
	s.free = nil
	s.head.prev, s.head.next = &s.head, &s.head
	return nil
}

// buffer returns a page buffer of n bytes, recycled when possible.
func (s *Store) buffer(n int) []byte {
	if l := s.free[n]; len(l) > 0 {
		b := l[len(l)-1]
		s.free[n] = l[:len(l)-1]
		return b
	}
	return make([]byte, n)
}

func (s *Store) evictOldest() {
	e := s.head.prev
	if e == &s.head {
		// NB: only reachable if used > 0 with an empty list, a broken
		// accounting invariant.
		panic(errors.New("memstore: bytes in use but no page to evict"))
	}
	s.remove(e)
	s.stats.Evictions++
}

func (s *Store) remove(e *entry) {
	e.prev.next, e.next.prev = e.next, e.prev
	delete(s.pages, e.key)
	s.used -= int64(len(e.data))
	// Keep a bounded number of spare buffers per size.
	if l := s.free[len(e.data)]; len(l) < 8 {
		s.free[len(e.data)] = append(l, e.data)
	}
	e.data = nil
}

func (s *Store) pushFront(e *entry) {
	e.prev, e.next = &s.head, s.head.next
	s.head.next.prev = e
	s.head.next = e
}

func (s *Store) moveToFront(e *entry) {
	e.prev.next, e.next.prev = e.next, e.prev
	s.pushFront(e)
}

package redis

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/internal/ratelog"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

// logInterval is the least time between two logs of the same failure kind.
const logInterval = 5 * time.Second

// Store is the Redis Store v1.
type Store struct {
	cfg     Config
	payload tiers.PayloadGeometry
	slab    tiers.Slab
	log     *slog.Logger

	client  goredis.UniversalClient
	cluster *goredis.ClusterClient // nil in standalone mode
	ttl     time.Duration          // 0, or the TTL given to SET / GETEX

	// closeMu orders Close against the methods: they hold it shared, so
	// Close waits for calls in flight (each bounded by the timeout).
	closeMu sync.RWMutex
	closed  bool
	nextID  atomic.Uint64

	// Put pipeline: Put appends to pending; the gatherer stages items and
	// hands chunks to the sender.
	pendMu  sync.Mutex
	pending []*putJob
	wake    chan struct{}
	stop    chan struct{}
	chunks  chan *putChunk
	done    sync.WaitGroup

	acks  tiers.AckQueue
	ready chan struct{}

	hits, misses, corrupt atomic.Int64
	puts, putFailures     atomic.Int64
	pages, bytes          atomic.Int64
	rl                    *ratelog.Log // failures logged at most once per logInterval per kind
}

// log kinds rate-limited separately.
const (
	logPut     = "put"
	logGet     = "get"
	logCorrupt = "corrupt"
	logProbe   = "probe"
)

var _ tiers.Store = (*Store)(nil)

// Open connects to the servers the config names and returns the store.
// env.Slab is required. A server that cannot be reached at open is an
// error (naming the addresses), so a wrong address fails fast; later
// outages are misses and failed puts.
func Open(ctx context.Context, env tiers.Env, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := env.Validate(); err != nil {
		return nil, fmt.Errorf("redis store: %w", err)
	}
	if env.Slab == nil {
		return nil, errors.New("redis store: env has no slab to read and write pages through")
	}
	password, err := readPassword(cfg.PasswordFile)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := loadTLS(cfg.TLS)
	if err != nil {
		return nil, err
	}
	s := &Store{
		cfg:     cfg,
		payload: env.Payload,
		slab:    env.Slab,
		log:     env.Logger.With("tier", "redis"),
		ttl:     cfg.TTL,
		wake:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		chunks:  make(chan *putChunk, 1),
		ready:   tiers.NewAckReady(),
	}
	s.rl = ratelog.New(s.log, logInterval)
	maint := &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	switch cfg.Mode {
	case ModeStandalone:
		s.client = goredis.NewClient(&goredis.Options{
			Addr: cfg.Addresses[0], Username: cfg.Username, Password: password, TLSConfig: tlsCfg,
			Protocol: 2, DialTimeout: cfg.DialTimeout, ReadTimeout: cfg.Timeout, WriteTimeout: cfg.Timeout,
			ContextTimeoutEnabled: true, MaxRetries: 1, DialerRetries: 1, DisableIdentity: true,
			MaintNotificationsConfig: maint,
		})
	case ModeCluster:
		s.cluster = goredis.NewClusterClient(&goredis.ClusterOptions{
			Addrs: cfg.Addresses, Username: cfg.Username, Password: password, TLSConfig: tlsCfg,
			Protocol: 2, DialTimeout: cfg.DialTimeout, ReadTimeout: cfg.Timeout, WriteTimeout: cfg.Timeout,
			ContextTimeoutEnabled: true, MaxRedirects: 3, MaxRetries: 1, DialerRetries: 1, DisableIdentity: true,
			MaintNotificationsConfig: maint,
		})
		s.client = s.cluster
	}
	pctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	if err := s.client.Ping(pctx).Err(); err != nil {
		s.client.Close()
		hint := ""
		if strings.Contains(err.Error(), "cluster support disabled") {
			hint = " (the server is not a cluster: set mode: standalone)"
		}
		return nil, fmt.Errorf("redis store: %s %v: ping: %w%s", cfg.Mode, cfg.Addresses, err, hint)
	}
	s.checkPolicy(pctx)
	if env.ColdStart == tiers.ColdStartClear {
		// NB: the keys are content addresses shared by every host on the
		// same key_prefix, and every value is verified on read, so pages a
		// previous run left are correct pages: clearing them would take
		// them from the other hosts too.
		s.log.Info("redis store keeps pages across restarts: cold start clear leaves the server's pages in place")
	}
	if r := env.Registerer; r != nil {
		if err := r.Register(newCollector(s, env.Rank)); err != nil {
			s.log.Warn("redis store metrics not registered", "error", err)
		}
	}
	s.done.Add(1 + putSenders)
	go s.gatherLoop()
	for range putSenders {
		go s.sendLoop()
	}
	return s, nil
}

// checkPolicy logs each master's maxmemory-policy, warning when it cannot
// evict (puts then fail with OOM once the server is full). Best effort: a
// managed service may refuse CONFIG GET.
func (s *Store) checkPolicy(ctx context.Context) {
	check := func(ctx context.Context, c *goredis.Client) error {
		v, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil {
			s.log.Debug("redis store: cannot read maxmemory-policy", "addr", c.Options().Addr, "error", err)
			return nil
		}
		policy := v["maxmemory-policy"]
		if policy == "noeviction" || strings.HasPrefix(policy, "volatile-") && s.ttl == 0 {
			s.log.Warn("redis server will not evict kvtier pages: puts fail once it is full; use allkeys-lru or allkeys-lfu",
				"addr", c.Options().Addr, "maxmemory_policy", policy)
		}
		return nil
	}
	if s.cluster != nil {
		_ = s.cluster.ForEachMaster(ctx, check)
		return
	}
	_ = check(ctx, s.client.(*goredis.Client))
}

// redisKey returns the key of a page payload.
func (s *Store) redisKey(k tiers.Key) string {
	var b strings.Builder
	b.Grow(len(s.cfg.KeyPrefix) + 5 + 2*len(k.Hash))
	b.WriteString(s.cfg.KeyPrefix)
	b.WriteByte('p')
	b.WriteString(strconv.Itoa(int(k.Kind)))
	b.WriteByte(':')
	var h [2 * len(pagehash.Hash{})]byte
	hex.Encode(h[:], k.Hash[:])
	b.Write(h[:])
	return b.String()
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
	if int64(len(b)) != size {
		return nil, fmt.Errorf("span for %s: slab returned %d bytes, want %d: %w", k, len(b), size, tiers.ErrInvalid)
	}
	return b, nil
}

// DrainAcks appends queued acks to dst.
func (s *Store) DrainAcks(dst []tiers.Ack) []tiers.Ack {
	return s.acks.Drain(dst)
}

// AckReady is signalled when acks are queued.
func (s *Store) AckReady() <-chan struct{} { return s.ready }

// Stats returns counters. Pages and Bytes count the pages this store wrote
// and has not deleted itself: an upper bound, since the server evicts and
// expires pages without telling it (Evictions stays 0 for that reason;
// the server's evicted_keys counts them).
func (s *Store) Stats() tiers.StoreStats {
	return tiers.StoreStats{
		Pages:       max(0, s.pages.Load()),
		Bytes:       max(0, s.bytes.Load()),
		Hits:        s.hits.Load(),
		Misses:      s.misses.Load(),
		Corrupt:     s.corrupt.Load(),
		Puts:        s.puts.Load(),
		PutFailures: s.putFailures.Load(),
	}
}

// Close stops accepting work, fails the put items not yet staged with
// ErrClosed, waits for the ones in flight and closes the connections.
// Calling it twice returns ErrClosed.
func (s *Store) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return tiers.ErrClosed
	}
	s.closed = true
	s.closeMu.Unlock()
	close(s.stop)
	s.done.Wait()
	if err := s.client.Close(); err != nil {
		return fmt.Errorf("redis store close: %w", err)
	}
	return nil
}

// refreshSlots asks the cluster client to reload its slot map after a
// failure, so that a promoted replica is found without waiting for the
// client's own periodic reload. The reload is asynchronous and coalesced.
func (s *Store) refreshSlots() {
	if s.cluster != nil {
		s.cluster.ReloadState(context.Background())
	}
}

// logRate logs msg at warn level at most once per logInterval per kind.
func (s *Store) logRate(kind, msg string, args ...any) { s.rl.Warn(kind, msg, args...) }

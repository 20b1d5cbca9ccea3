package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
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
	"github.com/kvtier/kvtier/tiers/redis/internal/crc32c"
)

// ErrNotReplicated is the error of a put item whose master confirmed it but
// fewer than min_replicas replicas did within replica_timeout.
var ErrNotReplicated = errors.New("not confirmed by enough replicas")

// errRaced marks a put whose APPEND found a value of the wrong length.
var errRaced = errors.New("another put of the same page ran between SET and APPEND")

// putSenders is the number of chunks in flight to the servers at once: with
// two, one chunk's replies are read while the next one is written, so the
// server never waits for the client between chunks.
const putSenders = 2

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

// putJob is one accepted Put batch.
type putJob struct {
	id   tiers.BatchID
	reqs []tiers.PutRequest
	srcs [][]byte
}

// putChunk is up to pipeline_depth items of one job. The payloads are
// still in the slab and are sent from there.
type putChunk struct {
	id    tiers.BatchID
	index []int // item index within the batch
	keys  []tiers.Key
	srcs  [][]byte // the payloads, in the slab
	crcs  []*pageCRC
}

// pageCRC is the CRC-32C of one put item's payload, computed on its own
// goroutine while the payload is being written to the socket: the SET's
// argument starts it as go-redis writes the command, the APPEND's waits
// for it. So the checksum runs beside the write (whose syscall mostly
// waits for the server to read) instead of between two writes, and reads
// the page while the write brings it into cache.
type pageCRC struct {
	key  tiers.Key
	src  []byte
	once sync.Once
	done chan struct{}
	crc  uint32
}

func newPageCRC(key tiers.Key, src []byte) *pageCRC {
	return &pageCRC{key: key, src: src, done: make(chan struct{})}
}

// start begins the checksum, once.
func (p *pageCRC) start() {
	p.once.Do(func() {
		go func() {
			p.crc = crc32c.Checksum(p.src)
			close(p.done)
		}()
	})
}

// payloadArg is the SET's value argument: the payload itself, from the
// slab (go-redis writes a marshaled argument as it writes a []byte: a large
// one straight to the socket).
type payloadArg struct{ p *pageCRC }

// MarshalBinary starts the checksum and returns the payload.
func (a payloadArg) MarshalBinary() ([]byte, error) {
	a.p.start()
	return a.p.src, nil
}

// trailerArg is the APPEND's argument: the trailer, once the checksum is
// done. On a retry both are marshaled again; the checksum is not redone.
type trailerArg struct{ p *pageCRC }

// MarshalBinary waits for the checksum and returns the trailer.
func (a trailerArg) MarshalBinary() ([]byte, error) {
	a.p.start() // NB: a no-op after the SET's; never waits on work not begun
	<-a.p.done
	var b [TrailerSize]byte
	Trailer{Kind: a.p.key.Kind, Hash: a.p.key.Hash, Length: uint64(len(a.p.src)), PayloadCRC: a.p.crc}.Encode(b[:])
	return b[:], nil
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

// readPassword reads the password file, if any.
func readPassword(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("redis store: password_file: %w", err)
	}
	p := strings.TrimRight(string(b), "\r\n")
	if p == "" {
		return "", fmt.Errorf("redis store: password_file %s is empty", path)
	}
	if strings.ContainsAny(p, "\r\n") {
		return "", fmt.Errorf("redis store: password_file %s has more than one line", path)
	}
	return p, nil
}

// loadTLS builds the TLS config, or nil without a tls block.
func loadTLS(t *TLS) (*tls.Config, error) {
	if t == nil {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify} //nolint:gosec // opt-in, for tests
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("redis store: tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis store: tls.ca_file %s: no PEM certificate in it", t.CAFile)
		}
		c.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("redis store: tls.cert_file %s, key_file %s: %w", t.CertFile, t.KeyFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
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

// Put accepts the batch and returns at once; the gatherer and the sender
// acknowledge its items.
func (s *Store) Put(_ context.Context, batch []tiers.PutRequest) (tiers.BatchID, error) {
	srcs := make([][]byte, len(batch))
	for i, r := range batch {
		b, err := s.span(r.Key, r.Src)
		if err != nil {
			return 0, fmt.Errorf("redis put item %d: %w", i, err)
		}
		srcs[i] = b
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return 0, tiers.ErrClosed
	}
	if len(batch) == 0 {
		return 0, nil
	}
	job := &putJob{id: tiers.BatchID(s.nextID.Add(1)), reqs: append([]tiers.PutRequest(nil), batch...), srcs: srcs}
	s.puts.Add(int64(len(batch)))
	s.pendMu.Lock()
	s.pending = append(s.pending, job)
	s.pendMu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return job.id, nil
}

// gatherLoop cuts accepted batches into chunks of pipeline_depth items and
// hands them to the senders; the payloads stay in the slab. On stop it
// fails every item not yet handed over with ErrClosed.
func (s *Store) gatherLoop() {
	defer s.done.Done()
	defer close(s.chunks)
	for {
		s.pendMu.Lock()
		var job *putJob
		if len(s.pending) > 0 {
			job = s.pending[0]
			s.pending[0] = nil
			s.pending = s.pending[1:]
		}
		s.pendMu.Unlock()
		if job == nil {
			select {
			case <-s.wake:
				continue
			case <-s.stop:
				s.failPending()
				return
			}
		}
		depth := s.cfg.PipelineDepth
		for start := 0; start < len(job.reqs); start += depth {
			select {
			case <-s.stop:
				s.failItems(job.id, start, len(job.reqs), tiers.ErrClosed)
				s.failPending()
				return
			default:
			}
			end := min(start+depth, len(job.reqs))
			c := &putChunk{id: job.id}
			for i := start; i < end; i++ {
				key := job.reqs[i].Key
				c.index = append(c.index, i)
				c.keys = append(c.keys, key)
				c.srcs = append(c.srcs, job.srcs[i])
				c.crcs = append(c.crcs, newPageCRC(key, job.srcs[i]))
				job.srcs[i] = nil
			}
			s.chunks <- c
		}
	}
}

// failPending fails every item of every job not yet started.
func (s *Store) failPending() {
	s.pendMu.Lock()
	jobs := s.pending
	s.pending = nil
	s.pendMu.Unlock()
	for _, j := range jobs {
		s.failItems(j.id, 0, len(j.reqs), tiers.ErrClosed)
	}
}

func (s *Store) failItems(id tiers.BatchID, from, to int, err error) {
	acks := make([]tiers.Ack, 0, to-from)
	for i := from; i < to; i++ {
		acks = append(acks, tiers.Ack{Batch: id, Index: i, Stage: tiers.AckFailed, Err: err})
	}
	s.putFailures.Add(int64(to - from))
	s.acks.Push(s.ready, acks...)
}

// sendLoop writes chunks and acknowledges their items gathered and durable,
// or failed. The payloads go from the slab to the socket with no copy in
// between, so an item is gathered (its span free for the host) only once
// its round trip is over: the bytes are then in the server, or the item
// failed, and no retry will read the span again. It drains every chunk the
// gatherer made, even after Close began: those items are in flight and
// Close waits for them.
func (s *Store) sendLoop() {
	defer s.done.Done()
	for c := range s.chunks {
		errs := s.send(c)
		acks := make([]tiers.Ack, 0, 2*len(c.keys))
		failed := 0
		for j := range c.keys {
			if errs[j] != nil {
				acks = append(acks, tiers.Ack{Batch: c.id, Index: c.index[j], Stage: tiers.AckFailed, Err: errs[j]})
				failed++
				continue
			}
			acks = append(acks,
				tiers.Ack{Batch: c.id, Index: c.index[j], Stage: tiers.AckGathered},
				tiers.Ack{Batch: c.id, Index: c.index[j], Stage: tiers.AckDurable})
			s.pages.Add(1)
			s.bytes.Add(int64(len(c.srcs[j])))
		}
		c.srcs, c.crcs = nil, nil
		if failed > 0 {
			s.refreshSlots()
			s.putFailures.Add(int64(failed))
			s.logRate(logPut, "redis puts failed", "failed", failed, "of", len(c.keys), "first_error", firstErr(errs))
		}
		s.acks.Push(s.ready, acks...)
	}
}

// send writes one chunk and returns each item's error.
func (s *Store) send(c *putChunk) []error {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	errs := make([]error, len(c.keys))
	s.sendItems(ctx, c, all(len(c.keys)), errs)
	// NB: two puts of one page at once can interleave as SET, SET, APPEND,
	// APPEND; the second APPEND sees the wrong length. Its put writes the
	// page again, once, so that the value ends whole (a reader meanwhile
	// gets a corrupt miss, never wrong bytes).
	var raced []int
	for j, err := range errs {
		if errors.Is(err, errRaced) {
			errs[j] = nil
			raced = append(raced, j)
		}
	}
	if len(raced) > 0 {
		s.sendItems(ctx, c, raced, errs)
		// A page that raced again is left broken: unlink it, so that it
		// reads as a plain miss.
		pipe := s.client.Pipeline()
		n := 0
		for _, j := range raced {
			if errors.Is(errs[j], errRaced) {
				pipe.Unlink(ctx, s.redisKey(c.keys[j]))
				n++
			}
		}
		if n > 0 {
			_, _ = pipe.Exec(ctx)
		}
	}
	return errs
}

// sendItems sends the items idx of c, to their masters in cluster mode.
func (s *Store) sendItems(ctx context.Context, c *putChunk, idx []int, errs []error) {
	if s.cluster != nil {
		s.sendPerMaster(ctx, c, idx, errs)
		return
	}
	s.sendOn(ctx, s.client.(*goredis.Client), c, idx, errs)
}

func all(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// sendOn pipelines the items idx of c on one server (a standalone server
// or one cluster master), each as MULTI, SET key payload, APPEND key
// trailer, EXEC (and a WAIT after them when min_replicas is set), filling
// errs. The payload is written from the slab (go-redis writes a large
// argument straight to the socket) and the server keeps the bulk string it
// read as the value, so neither side copies the page; the transaction makes
// the value appear whole, never a payload without its trailer, even with
// two hosts putting the same page at once.
func (s *Store) sendOn(ctx context.Context, client *goredis.Client, c *putChunk, idx []int, errs []error) {
	pipe := client.Pipeline()
	type itemCmds struct{ set, app *goredis.Cmd }
	cmds := make([]itemCmds, len(idx))
	for n, j := range idx {
		key := s.redisKey(c.keys[j])
		if s.ttl > 0 {
			cmds[n].set = pipe.Do(ctx, "set", key, payloadArg{c.crcs[j]}, "px", s.ttl.Milliseconds())
		} else {
			cmds[n].set = pipe.Do(ctx, "set", key, payloadArg{c.crcs[j]})
		}
		cmds[n].app = pipe.Do(ctx, "append", key, trailerArg{c.crcs[j]})
	}
	var wait *goredis.Cmd
	if s.cfg.MinReplicas > 0 {
		// NB: Pipeliner has no typed Wait; WAIT numreplicas timeout-ms.
		wait = pipe.Do(ctx, "wait", s.cfg.MinReplicas, s.cfg.ReplicaTimeout.Milliseconds())
	}
	_, _ = pipe.Exec(ctx) // per-command errors below
	var torn []string
	for n, j := range idx {
		if err := appendError(cmds[n].set, cmds[n].app, int64(len(c.srcs[j])+TrailerSize)); err != nil {
			errs[j] = putError(c.keys[j], err)
			// NB: either command alone changes the value: a SET whose
			// APPEND failed leaves a payload without its trailer, an APPEND
			// after a failed SET (refused as OOM while its argument was in
			// memory, when the APPEND's small one was not) leaves a trailer
			// alone. A raced item is written again by send.
			_, appErr := cmds[n].app.Int64()
			if (cmds[n].set.Err() == nil || appErr == nil) && !errors.Is(err, errRaced) {
				torn = append(torn, s.redisKey(c.keys[j]))
			}
		}
	}
	if len(torn) > 0 {
		// Unlink what half a put left (allowed when the server is full)
		// rather than leave a value that reads as a corrupt miss. Best
		// effort: if the server is gone, so is the read.
		// NB: one key per UNLINK, as a cluster master refuses keys of
		// several slots in one command.
		up := client.Pipeline()
		for _, k := range torn {
			up.Unlink(ctx, k)
		}
		_, _ = up.Exec(ctx)
	}
	if wait == nil {
		return
	}
	got, err := wait.Int64()
	for _, j := range idx {
		switch {
		case errs[j] != nil:
		case err != nil:
			errs[j] = fmt.Errorf("redis put %s: wait for %d replicas: %w", c.keys[j], s.cfg.MinReplicas, err)
		case got < int64(s.cfg.MinReplicas):
			errs[j] = fmt.Errorf("redis put %s: %d of %d replicas in %v: %w", c.keys[j], got, s.cfg.MinReplicas, s.cfg.ReplicaTimeout, ErrNotReplicated)
		}
	}
}

// sendPerMaster sends a chunk master by master so that each WAIT runs on
// the connection that carried its SETs (WAIT counts the replicas that have
// the writes of its own connection). Items answered MOVED (the slot moved
// since the routing: a failover) are retried once on the new master, after
// the client's slot map has caught up; items answered ASK (a slot being
// migrated) fail.
func (s *Store) sendPerMaster(ctx context.Context, c *putChunk, idx []int, errs []error) {
	for attempt := 0; attempt < 2 && len(idx) > 0; attempt++ {
		groups := map[*goredis.Client][]int{}
		for _, j := range idx {
			m, err := s.cluster.MasterForKey(ctx, s.redisKey(c.keys[j]))
			if err != nil {
				errs[j] = putError(c.keys[j], err)
				continue
			}
			groups[m] = append(groups[m], j)
		}
		var wg sync.WaitGroup
		for m, g := range groups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.sendOn(ctx, m, c, g, errs)
			}()
		}
		wg.Wait()
		if attempt > 0 {
			return
		}
		var retry []int
		moved := map[int]string{}
		for _, j := range idx {
			if addr, ok := goredis.IsMovedError(errs[j]); ok && errs[j] != nil {
				moved[j] = addr
				retry = append(retry, j)
			}
		}
		if len(retry) == 0 {
			return
		}
		// NB: ReloadState only schedules a reload; wait until the slot map
		// names the masters the MOVED replies named.
		s.cluster.ReloadState(ctx)
		for _, j := range retry {
			for !s.routesTo(ctx, c.keys[j], moved[j]) {
				select {
				case <-ctx.Done():
					// NB: every retry item keeps its MOVED error: none
					// was resent, so none may be acknowledged durable.
					return
				case <-time.After(10 * time.Millisecond):
				}
				s.cluster.ReloadState(ctx)
			}
		}
		for _, j := range retry {
			errs[j] = nil
		}
		idx = retry
	}
}

// routesTo reports whether the cluster client sends key k to addr now.
func (s *Store) routesTo(ctx context.Context, k tiers.Key, addr string) bool {
	m, err := s.cluster.MasterForKey(ctx, s.redisKey(k))
	return err == nil && m.Options().Addr == addr
}

// appendError returns the first error of one item's SET and APPEND
// replies, or an error when the APPEND did not make a value of size bytes.
func appendError(set, app *goredis.Cmd, size int64) error {
	if err := set.Err(); err != nil {
		return err
	}
	n, err := app.Int64()
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("append made a value of %d bytes, want %d: %w", n, size, errRaced)
	}
	return nil
}

// putError wraps a server error of one put item; a full server is
// tiers.ErrFull.
func putError(k tiers.Key, err error) error {
	if goredis.IsOOMError(err) {
		return fmt.Errorf("redis put %s: %w: %w", k, tiers.ErrFull, err)
	}
	return fmt.Errorf("redis put %s: %w", k, err)
}

func firstErr(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// Get reads and verifies the batch, pipeline_depth pages per round trip,
// all within the config's timeout: what has not arrived by then is a miss.
func (s *Store) Get(ctx context.Context, batch []tiers.GetRequest, results []error) error {
	if len(results) != len(batch) {
		return fmt.Errorf("redis get: %d results for %d requests: %w", len(results), len(batch), tiers.ErrInvalid)
	}
	dsts := make([][]byte, len(batch))
	for i, r := range batch {
		b, err := s.span(r.Key, r.Dst)
		if err != nil {
			return fmt.Errorf("redis get item %d: %w", i, err)
		}
		dsts[i] = b
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return tiers.ErrClosed
	}
	depth := s.cfg.PipelineDepth
	cmds := make([]*goredis.StringCmd, min(depth, len(batch)))
	// NB: one deadline for the whole call, not per round trip: a call of
	// many chunks against a silent node must still end within the timeout
	// (a plugin host kills a plugin whose call runs past its deadline).
	rctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	for start := 0; start < len(batch); start += depth {
		end := min(start+depth, len(batch))
		pipe := s.client.Pipeline()
		for i := start; i < end; i++ {
			key := s.redisKey(batch[i].Key)
			if s.ttl > 0 {
				cmds[i-start] = pipe.GetEx(rctx, key, s.ttl)
			} else {
				cmds[i-start] = pipe.Get(rctx, key)
			}
		}
		_, _ = pipe.Exec(rctx) // per-command errors below
		for i := start; i < end; i++ {
			results[i] = s.verifyInto(batch[i].Key, cmds[i-start], dsts[i])
		}
		clear(cmds)
	}
	return nil
}

// verifyInto checks one GET reply and copies a verified payload into dst.
func (s *Store) verifyInto(k tiers.Key, cmd *goredis.StringCmd, dst []byte) error {
	v, err := cmd.Bytes()
	switch {
	case errors.Is(err, goredis.Nil):
		s.misses.Add(1)
		return fmt.Errorf("redis %s: not stored: %w", k, tiers.ErrMiss)
	case err != nil:
		s.misses.Add(1)
		s.refreshSlots()
		s.logRate(logGet, "redis gets failed: served as misses", "key", k.String(), "error", err)
		return fmt.Errorf("redis %s: %w: %w", k, tiers.ErrMiss, err)
	}
	payload, err := VerifyValue(v, k, int64(len(dst)))
	if err != nil {
		s.misses.Add(1)
		s.corrupt.Add(1)
		s.logRate(logCorrupt, "redis value failed verification: served as a miss", "key", k.String(), "error", err)
		return fmt.Errorf("redis %s: %w: %w", k, tiers.ErrMiss, err)
	}
	copy(dst, payload)
	s.hits.Add(1)
	return nil
}

// LongestPrefix asks for every hash of chain in one pipelined batch and
// counts the leading ones present. A key the server cannot answer for
// (its master is down) counts as absent.
func (s *Store) LongestPrefix(ctx context.Context, kind tiers.PayloadKind, chain []pagehash.Hash) (int, error) {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return 0, tiers.ErrClosed
	}
	if len(chain) == 0 {
		return 0, nil
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	pipe := s.client.Pipeline()
	cmds := make([]*goredis.IntCmd, len(chain))
	for i, h := range chain {
		cmds[i] = pipe.Exists(rctx, s.redisKey(tiers.Key{Hash: h, Kind: kind}))
	}
	_, _ = pipe.Exec(rctx)
	for i, c := range cmds {
		n, err := c.Result()
		if err != nil {
			s.refreshSlots()
			s.logRate(logProbe, "redis prefix probe failed: counted as absent", "error", err)
			return i, nil
		}
		if n != 1 {
			return i, nil
		}
	}
	return len(chain), nil
}

// Delete unlinks keys. A key whose master cannot be reached is reported
// in the error (the page may stay until the server evicts it; it is still
// a correct page).
func (s *Store) Delete(ctx context.Context, keys []tiers.Key) error {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return tiers.ErrClosed
	}
	if len(keys) == 0 {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	pipe := s.client.Pipeline()
	cmds := make([]*goredis.IntCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Unlink(rctx, s.redisKey(k))
	}
	_, _ = pipe.Exec(rctx)
	var errs []error
	for i, c := range cmds {
		n, err := c.Result()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", keys[i], err))
			continue
		}
		if n == 1 {
			size, _ := s.payload.PageBytes(keys[i].Kind)
			s.pages.Add(-1)
			s.bytes.Add(-size)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("redis delete: %d of %d keys failed: %w", len(errs), len(keys), errors.Join(errs...))
	}
	return nil
}

// Touch refreshes the server's recency of keys (TOUCH) and, with a TTL,
// their expiry. Keys that are absent or unreachable are skipped.
func (s *Store) Touch(ctx context.Context, keys []tiers.Key) error {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return tiers.ErrClosed
	}
	if len(keys) == 0 {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	pipe := s.client.Pipeline()
	cmds := make([]goredis.Cmder, 0, len(keys))
	for _, k := range keys {
		key := s.redisKey(k)
		cmds = append(cmds, pipe.Touch(rctx, key))
		if s.ttl > 0 {
			cmds = append(cmds, pipe.PExpire(rctx, key, s.ttl))
		}
	}
	_, _ = pipe.Exec(rctx)
	if err := firstCmdErr(cmds); err != nil {
		s.logRate(logProbe, "redis touch failed for some keys: skipped", "error", err)
	}
	return nil
}

func firstCmdErr(cmds []goredis.Cmder) error {
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return err
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

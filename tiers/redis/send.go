package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/internal/crc32c"
	"github.com/kvtier/kvtier/tiers"
)

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

// givenPageCRC is a pageCRC that carries the producer's checksum
// (tiers.PutRequest.Sum): the trailer takes it as given and the payload is
// never read for it, so bytes that changed in the slab after the producer
// took it fail every GET's verification (a miss) instead of being stored
// under a valid checksum of our own.
func givenPageCRC(key tiers.Key, src []byte, sum uint32) *pageCRC {
	p := &pageCRC{key: key, src: src, done: make(chan struct{}), crc: sum}
	p.once.Do(func() {}) // NB: start is then a no-op: nothing to compute
	close(p.done)
	return p
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

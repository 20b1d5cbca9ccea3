package redis

import (
	"context"
	"errors"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

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

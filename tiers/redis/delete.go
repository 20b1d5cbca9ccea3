package redis

import (
	"context"
	"errors"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/tiers"
)

// Delete unlinks keys. A key whose master cannot be reached is reported
// in the error (the page may stay until the server evicts it; it is still
// a correct page).
func (s *Store) Delete(ctx context.Context, keys []tiers.Key) error {
	cmds := make([]*goredis.IntCmd, len(keys))
	var errs []error
	err := s.pipelined(ctx, keys, func(rctx context.Context, pipe goredis.Pipeliner, i int, key string) {
		cmds[i] = pipe.Unlink(rctx, key)
	}, func() {
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
	})
	if err != nil {
		return err
	}
	if len(errs) > 0 {
		return fmt.Errorf("redis delete: %d of %d keys failed: %w", len(errs), len(keys), errors.Join(errs...))
	}
	return nil
}

// pipelined sends add's commands for every key on one pipeline, under the
// store's call guard and timeout, then runs then on the results while the
// guard is still held. No keys: nothing is sent.
func (s *Store) pipelined(ctx context.Context, keys []tiers.Key, add func(rctx context.Context, pipe goredis.Pipeliner, i int, key string), then func()) error {
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
	for i, k := range keys {
		add(rctx, pipe, i, s.redisKey(k))
	}
	_, _ = pipe.Exec(rctx)
	then()
	return nil
}

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

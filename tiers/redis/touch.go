package redis

import (
	"context"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/tiers"
)

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

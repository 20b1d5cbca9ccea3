package redis

import (
	"context"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/tiers"
)

// Touch refreshes the server's recency of keys (TOUCH) and, with a TTL,
// their expiry. Keys that are absent or unreachable are skipped.
func (s *Store) Touch(ctx context.Context, keys []tiers.Key) error {
	cmds := make([]goredis.Cmder, 0, len(keys))
	return s.pipelined(ctx, keys, func(rctx context.Context, pipe goredis.Pipeliner, _ int, key string) {
		cmds = append(cmds, pipe.Touch(rctx, key))
		if s.ttl > 0 {
			cmds = append(cmds, pipe.PExpire(rctx, key, s.ttl))
		}
	}, func() {
		if err := firstCmdErr(cmds); err != nil {
			s.logRate(logProbe, "redis touch failed for some keys: skipped", "error", err)
		}
	})
}

func firstCmdErr(cmds []goredis.Cmder) error {
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return err
		}
	}
	return nil
}

// Command kvtier-plugin-redis serves kvtier's Redis Store (tiers/redis) out
// of process through plugins/sdk: the model for a third-party network tier.
// Pages travel between the host's slab files, which the SDK maps, and the
// Redis servers; only spans and keys cross gRPC.
//
// Config (the `plugin.config` block of a store tier), the same fields as the
// in-process `redis` module:
//
//	mode: cluster                       # or standalone
//	addresses: ["10.0.0.1:6379", "10.0.0.2:6379"]
//	password_file: /run/secrets/redis   # never the secret itself
//	key_prefix: "kvtier:llama3-70b:bf16:p64:"
//	pipeline_depth: 32
//	timeout: 5s
//	min_replicas: 1                     # durable = WAIT for one replica
//
// It never writes to stdout: stdout is the go-plugin handshake channel.
// go-redis's own log lines go to the SDK's logger, which the host re-logs.
package main

import (
	"context"
	"fmt"
	"log/slog"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/plugins/sdk"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/redis"
)

// slogPrinter adapts go-redis's logger to slog.
type slogPrinter struct{ l *slog.Logger }

func (p slogPrinter) Printf(ctx context.Context, format string, v ...any) {
	p.l.WarnContext(ctx, fmt.Sprintf(format, v...), "source", "go-redis")
}

func main() {
	sdk.Serve(sdk.Plugin{
		Name:    "redis",
		Version: "v1",
		OpenStore: func(ctx context.Context, env tiers.Env, config []byte) (tiers.Store, error) {
			cfg := redis.DefaultConfig()
			if err := sdk.DecodeConfig(config, &cfg); err != nil {
				return nil, err
			}
			// NB: go-redis logs through a process-wide logger; this process
			// serves one store, so it is this store's.
			goredis.SetLogger(slogPrinter{env.Logger})
			st, err := redis.Open(ctx, env, cfg)
			if err != nil {
				return nil, err // not a nil *redis.Store inside a tiers.Store
			}
			return st, nil
		},
	})
}

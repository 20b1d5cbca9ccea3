// Command kvtier-plugin-memstore is the example third-party Store plugin: it
// serves kvtier's in-process reference store (tiers/memstore) out of process
// through plugins/sdk. Pages travel through the host's slab files, which the
// SDK maps; only spans and keys cross gRPC.
//
// Config (the `plugin.config` block of a store tier):
//
//	capacity: 1073741824   # byte budget of stored payload pages
//
// It never writes to stdout: stdout is the go-plugin handshake channel.
package main

import (
	"context"

	"github.com/kvtier/kvtier/plugins/sdk"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/memstore"
)

func main() {
	sdk.Serve(sdk.Plugin{
		Name:    "memstore",
		Version: "v1",
		OpenStore: func(_ context.Context, env tiers.Env, config []byte) (tiers.Store, error) {
			cfg := memstore.DefaultConfig()
			if err := sdk.DecodeConfig(config, &cfg); err != nil {
				return nil, err
			}
			return memstore.Open(env, cfg)
		},
	})
}

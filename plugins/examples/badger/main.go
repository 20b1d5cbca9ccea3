// Command kvtier-plugin-badger is the example third-party Index plugin: it
// serves kvtier's Badger index (indexes/badger) out of process through
// plugins/sdk.
//
// Config (the `plugin.config` block of an index), as indexes/badger's:
//
//	dir: /var/lib/kvtier/index   # default: the directory the host names
//	sync: true
//	memtable_bytes: 67108864
//	block_cache_bytes: 16777216
//
// It never writes to stdout: stdout is the go-plugin handshake channel.
package main

import (
	"context"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/badger"
	"github.com/kvtier/kvtier/plugins/sdk"
)

func main() {
	sdk.Serve(sdk.Plugin{
		Name:    "badger",
		Version: "v1",
		OpenIndex: func(ctx context.Context, env indexes.Env, config []byte) (indexes.Index, error) {
			cfg := badger.DefaultConfig()
			if err := sdk.DecodeConfig(config, &cfg); err != nil {
				return nil, err
			}
			return badger.Open(ctx, env, cfg)
		},
	})
}

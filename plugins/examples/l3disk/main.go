// Command kvtier-plugin-l3disk is an example third-party Store plugin with
// durable data: kvtier's O_DIRECT disk store (tiers/l3disk) located
// through its own Badger index (indexes/badger), served out of process
// through plugins/sdk. Unlike the memstore example, what it acknowledged
// durable survives the plugin being killed: the host restarts it with cold
// start "load" and finds the pages again.
//
// Config (the `plugin.config` block of a store tier): tiers/l3disk's keys,
// plus the index's directory:
//
//	disks: [{dir: /var/tmp/kvtier/l3, budget: 64GiB}]
//	index_dir: /var/tmp/kvtier/l3/index   # default: <first disk>/index
//
// It never writes to stdout: stdout is the go-plugin handshake channel.
package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/badger"
	"github.com/kvtier/kvtier/plugins/sdk"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l3disk"
)

// config is l3disk's config plus where the index lives.
type config struct {
	l3disk.Config `yaml:",inline"`
	// IndexDir is the Badger index directory; empty means "index" under
	// the first disk's directory.
	IndexDir string `yaml:"index_dir"`
}

// storeWithIndex closes the index after the store that writes it.
type storeWithIndex struct {
	tiers.Store
	index indexes.Index
}

// KeepsPutSums passes l3disk's tiers.SumKeeper through the wrapper, so
// the plugin answers keeps_put_sums (protocol 1.1).
func (s storeWithIndex) KeepsPutSums() bool {
	k, ok := s.Store.(tiers.SumKeeper)
	return ok && k.KeepsPutSums()
}

// Close closes the store, then the index it writes.
func (s storeWithIndex) Close() error {
	return errors.Join(s.Store.Close(), s.index.Close())
}

func open(ctx context.Context, env tiers.Env, raw []byte) (tiers.Store, error) {
	cfg := config{Config: l3disk.DefaultConfig()}
	if err := sdk.DecodeConfig(raw, &cfg); err != nil {
		return nil, err
	}
	if cfg.IndexDir == "" {
		if len(cfg.Disks) == 0 {
			return nil, fmt.Errorf("l3disk plugin: disks: at least one disk is required")
		}
		cfg.IndexDir = filepath.Join(cfg.Disks[0].Dir, "index")
	}
	ix, err := badger.Open(ctx, indexes.Env{Logger: env.Logger, Dir: cfg.IndexDir}, badger.DefaultConfig())
	if err != nil {
		return nil, fmt.Errorf("l3disk plugin: %w", err)
	}
	env.Index = ix
	st, err := l3disk.Open(ctx, env, cfg.Config)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("l3disk plugin: %w", err), ix.Close())
	}
	return storeWithIndex{Store: st, index: ix}, nil
}

func main() {
	sdk.Serve(sdk.Plugin{Name: "l3disk", Version: "v1", OpenStore: open})
}

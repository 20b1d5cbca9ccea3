package datareplay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/host/stack"
	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/lmdb"
	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l3disk"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs/errorfs"
)

// faultyL3 returns a Stores hook that replaces the stack's stores with an
// l3disk (LMDB index) doing its I/O through errorfs with the given rules.
func faultyL3(dir string, inj errorfs.Injector) func(ctx context.Context, s *stack.Stack) (func() error, error) {
	return func(ctx context.Context, s *stack.Stack) (func() error, error) {
		ix, err := lmdb.Open(ctx, indexes.Env{Logger: slog.New(slog.DiscardHandler), Dir: filepath.Join(dir, "findex")}, lmdb.DefaultConfig())
		if err != nil {
			return nil, err
		}
		cfg := l3disk.DefaultConfig()
		cfg.Disks = []l3disk.Disk{{Dir: filepath.Join(dir, "fl3"), Budget: 256 * quantity.MiB}}
		env := tiers.Env{Logger: slog.New(slog.DiscardHandler), Payload: s.Config.Payload, WorldSize: 1, StackID: "replaydata",
			Slab: s.Slab, ColdStart: tiers.ColdStartClear, Index: ix}
		g := &gated{inner: inj}
		st, err := l3disk.OpenFS(ctx, env, cfg, errorfs.Wrap(diskfs.OS{}, g))
		if err != nil {
			return nil, errors.Join(err, ix.Close())
		}
		g.on.Store(true) // faults from the first page on, not in open's preallocation
		s.Stores = []stack.Store{{Name: "faulty-l3", Store: st, Index: ix}}
		return func() error { return errors.Join(st.Close(), ix.Close()) }, nil
	}
}

// gated passes operations to inner only once on is set.
type gated struct {
	on    atomic.Bool
	inner errorfs.Injector
}

func (g *gated) Inject(e errorfs.Event) *errorfs.Fault {
	if !g.on.Load() {
		return nil
	}
	return g.inner.Inject(e)
}

// TestDataFaults injects disk faults under the L3 store (torn writes, bit
// flips, EIO, ENOSPC, fsync EIO) during a data replay: the faults cost
// misses (failed spills, verification failures on reload), never a wrong
// byte, a hang or a crash.
func TestDataFaults(t *testing.T) {
	tr := headTrace(t, 300)
	cases := []struct {
		name  string
		op    errorfs.Op
		fault errorfs.Fault
		p     float64
	}{
		{"torn-write", errorfs.OpWrite, errorfs.Fault{Kind: errorfs.TornWrite, Keep: 4096}, 0.3},
		// NB: bytes of the payload in either slot layout (right after the
		// 64-byte header, or one block in for pages of whole blocks).
		{"bit-flip-read", errorfs.OpRead, errorfs.Fault{Kind: errorfs.FlipBit, At: 4096 + 100, Bit: 3}, 0.3},
		{"bit-flip-write", errorfs.OpWrite, errorfs.Fault{Kind: errorfs.FlipBit, At: 5000, Bit: 1}, 0.3},
		{"eio-read", errorfs.OpRead, errorfs.Fault{Kind: errorfs.Fail, Err: unix.EIO}, 0.3},
		{"eio-write", errorfs.OpWrite, errorfs.Fault{Kind: errorfs.Fail, Err: unix.EIO}, 0.3},
		{"enospc-write", errorfs.OpWrite, errorfs.Fault{Kind: errorfs.Fail, Err: unix.ENOSPC}, 0.3},
		{"fsync-eio", errorfs.OpSync, errorfs.Fault{Kind: errorfs.Fail, Err: unix.EIO}, 0.5},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			seed := uint64(1000 + i)
			rule := errorfs.NewRule(c.op, c.fault, seed)
			rule.Probability = c.p
			rule.PathContains = ".slab" // the slot files, not the open-time probes
			rule.Skip = 4               // let the store open
			dir := t.TempDir()
			res, err := RunData(context.Background(), tr, DataConfig{Dir: dir, Stores: faultyL3(dir, rule)})
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			msg := fmt.Sprintf("seed %d: fired %d, hit rate %.4f by tier %v, verified %d, wrong %d, failed %v, skips %v",
				seed, rule.Fired(), res.HitRate, res.HitPagesByTier, res.VerifiedPages, res.WrongBytes, res.FailedOps, res.Skips)
			t.Log(msg)
			if res.WrongBytes != 0 {
				t.Fatal(msg)
			}
			if rule.Fired() == 0 {
				t.Fatalf("the fault never fired: %s", msg)
			}
		})
	}
}

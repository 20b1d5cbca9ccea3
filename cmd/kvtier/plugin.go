package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/plugins"
	"github.com/kvtier/kvtier/plugins/pluginhost"
	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l2hugetlb"
	"github.com/spf13/cobra"
)

// newPluginCmd returns `kvtier plugin sum|check`: pin a plugin binary, and
// check that one starts, negotiates and serves before it goes into a stack.
func newPluginCmd() *cobra.Command {
	c := groupCommand("plugin", "pin (sum) or smoke-test (check) a tier or index plugin binary", newPluginSumCmd(), newPluginCheckCmd())
	c.Example = `  kvtier plugin sum bin/plugins/memstore
  kvtier plugin check bin/plugins/memstore --role store`
	return c
}

// newPluginSumCmd returns `kvtier plugin sum PATH`, which prints the
// `plugin:` block that pins PATH.
func newPluginSumCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "sum PATH",
		Short:   "print the plugin: block (path and sha256) that pins a plugin binary",
		Example: "  kvtier plugin sum bin/plugins/memstore >> stack.yaml",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return errors.New("plugin sum: want one PATH")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			sum, err := pluginhost.FileSHA256(args[0])
			if err != nil {
				return fmt.Errorf("plugin sum: %w", err)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "plugin:\n  path: %s\n  sha256: %s\n", args[0], sum)
			return err
		},
	}
}

// newPluginCheckCmd returns `kvtier check PATH`.
func newPluginCheckCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "check PATH [flags]",
		Short: "start a plugin binary as a host would and smoke-test its store or index",
		Long: `Starts the plugin as a host would (checksum, handshake, version
negotiation, AutoMTLS), opens it and runs a short smoke test.`,
		Example: `  kvtier plugin check bin/plugins/memstore
  kvtier plugin check bin/plugins/lmdbindex --role index`,
	}
	fs := cmd.Flags()
	role := fs.String("role", "store", "the role to check: store or index")
	cfgJSON := fs.String("config", "", "the plugin's config block as JSON (default: none)")
	sum := fs.String("sha256", "", "the pinned SHA-256 (default: the binary's own, i.e. check without pinning)")
	verbose := fs.BoolP("verbose", "v", false, "log the plugin's lines to stderr")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		stdout := cmd.OutOrStdout()
		stderr := cmd.ErrOrStderr()
		if fs.NArg() != 1 || (*role != "store" && *role != "index") {
			return fmt.Errorf("plugin check: want --role store|index and one PATH: %w", errUsage)
		}
		path := fs.Arg(0)
		var config any
		if *cfgJSON != "" {
			if err := json.Unmarshal([]byte(*cfgJSON), &config); err != nil {
				return fmt.Errorf("plugin check: --config: %w: %w", err, errUsage)
			}
		}
		if *sum == "" {
			s, err := pluginhost.FileSHA256(path)
			if err != nil {
				return fmt.Errorf("plugin check: %w", err)
			}
			*sum = s
		}
		logger := slog.New(slog.DiscardHandler)
		if *verbose {
			logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
		spec := pluginhost.PluginSpec{Name: "check", Path: path, SHA256: *sum, Config: config}
		fmt.Fprintf(stdout, "host speaks protocol versions [%s]\n", plugins.FormatVersions(plugins.Versions()))
		if *role == "index" {
			return checkIndex(ctx, spec, logger, stdout)
		}
		return checkStore(ctx, spec, logger, stdout)
	}
	return cmd
}

func checkStore(ctx context.Context, spec pluginhost.PluginSpec, logger *slog.Logger, stdout io.Writer) (err error) {
	const pageBytes = 64 << 10
	dir, err := os.MkdirTemp("", "kvtier-plugin-check-")
	if err != nil {
		return fmt.Errorf("plugin check: %w", err)
	}
	defer os.RemoveAll(dir)
	env := tiers.Env{
		Logger: logger, WorldSize: 1, StackID: "kvtier-plugin-check", ColdStart: tiers.ColdStartClear,
		Payload: tiers.PayloadGeometry{PageTokens: 16, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: pageBytes}}},
	}
	// A small shm slab in a private directory, as a host's L2 with the shm
	// fallback: the plugin must attach it by path.
	scfg := l2hugetlb.DefaultConfig()
	scfg.Size, scfg.Mount, scfg.ShmDir, scfg.Fallback = quantity.Size(4*pageBytes), dir+"/no-hugetlbfs", dir, l2hugetlb.FallbackShm
	slab, err := l2hugetlb.Open(ctx, env, scfg)
	if err != nil {
		return fmt.Errorf("plugin check: slab: %w", err)
	}
	defer func() { err = errors.Join(err, slab.Close()) }()
	env.Slab = slab
	st, err := pluginhost.OpenStore(ctx, env, spec)
	if err != nil {
		return fmt.Errorf("plugin check: %w", err)
	}
	defer func() { err = errors.Join(err, st.Close()) }()
	impl, version := st.Implementation()
	fmt.Fprintf(stdout, "store plugin %q: protocol %d, pid %d, slab mapped\n", impl, version, st.PID())
	// One page out through the slab and back in.
	src, dst := tiers.Span{Length: pageBytes}, tiers.Span{Offset: 2 * pageBytes, Length: pageBytes}
	in, _ := slab.Bytes(src)
	for i := range in {
		in[i] = byte(i * 7)
	}
	key := tiers.Key{Hash: pagehash.Next(pagehash.Root, []uint32{1, 2, 3})}
	start := time.Now()
	id, err := st.Put(ctx, []tiers.PutRequest{{Key: key, Src: src}})
	if err != nil {
		return fmt.Errorf("plugin check: put: %w", err)
	}
	if err := awaitDurable(ctx, st, id); err != nil {
		return fmt.Errorf("plugin check: %w", err)
	}
	fmt.Fprintf(stdout, "put 1 page: durable after %v\n", time.Since(start).Round(time.Microsecond))
	res := make([]error, 1)
	start = time.Now()
	if err := st.Get(ctx, []tiers.GetRequest{{Key: key, Dst: dst}}, res); err != nil || res[0] != nil {
		return fmt.Errorf("plugin check: get of the page just stored: %w", errors.Join(err, res[0]))
	}
	out, _ := slab.Bytes(dst)
	if !bytes.Equal(in, out) {
		return fmt.Errorf("plugin check: get returned different bytes than were put")
	}
	fmt.Fprintf(stdout, "get 1 page: byte-exact after %v\n", time.Since(start).Round(time.Microsecond))
	if n, err := st.LongestPrefix(ctx, 0, []pagehash.Hash{key.Hash, pagehash.Root}); err != nil || n != 1 {
		return fmt.Errorf("plugin check: longest prefix = %d, %v; want 1", n, err)
	}
	fmt.Fprintln(stdout, "longest prefix: ok")
	return nil
}

func awaitDurable(ctx context.Context, st tiers.Store, id tiers.BatchID) error {
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		for _, a := range st.DrainAcks(nil) {
			switch {
			case a.Batch != id:
			case a.Stage == tiers.AckDurable:
				return nil
			case a.Stage == tiers.AckFailed:
				return fmt.Errorf("put failed: %w", a.Err)
			}
		}
		select {
		case <-st.AckReady():
		case <-deadline.C:
			return fmt.Errorf("put: no durable ack within 30s")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func checkIndex(ctx context.Context, spec pluginhost.PluginSpec, logger *slog.Logger, stdout io.Writer) (err error) {
	dir, err := os.MkdirTemp("", "kvtier-plugin-check-")
	if err != nil {
		return fmt.Errorf("plugin check: %w", err)
	}
	defer os.RemoveAll(dir)
	x, err := pluginhost.OpenIndex(ctx, indexes.Env{Logger: logger, Dir: dir}, spec)
	if err != nil {
		return fmt.Errorf("plugin check: %w", err)
	}
	defer func() { err = errors.Join(err, x.Close()) }()
	impl, version := x.Implementation()
	fmt.Fprintf(stdout, "index plugin %q: protocol %d\n", impl, version)
	e := indexes.Entry{Key: indexes.Key{Hash: pagehash.Next(pagehash.Root, []uint32{9})}, Record: indexes.Record{Disk: 1, Slot: 42, Epoch: 3}}
	e.Record.Kind = e.Key.Kind
	if err := x.Put(ctx, []indexes.Entry{e}); err != nil {
		return fmt.Errorf("plugin check: put: %w", err)
	}
	recs, found := make([]indexes.Record, 1), make([]bool, 1)
	if err := x.Get(ctx, []indexes.Key{e.Key}, recs, found); err != nil || !found[0] || recs[0] != e.Record {
		return fmt.Errorf("plugin check: get after put: found %v record %+v, %v; want %+v", found[0], recs[0], err, e.Record)
	}
	n := 0
	if err := x.Iterate(ctx, func(indexes.Entry) error { n++; return nil }); err != nil || n != 1 {
		return fmt.Errorf("plugin check: iterate: %d entries, %v; want 1", n, err)
	}
	fmt.Fprintln(stdout, "put, get, iterate: ok")
	return nil
}

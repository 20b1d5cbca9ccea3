// Package sdk serves a Store v1 or an Index v1 implementation as a kvtier
// plugin binary in a few lines:
//
//	func main() {
//		sdk.Serve(sdk.Plugin{
//			Name: "mystore", Version: "0.1.0",
//			OpenStore: func(ctx context.Context, env tiers.Env, config []byte) (tiers.Store, error) {
//				var cfg myConfig
//				if err := sdk.DecodeConfig(config, &cfg); err != nil {
//					return nil, err
//				}
//				return mystore.Open(ctx, env, cfg) // reads and writes pages via env.Slab
//			},
//		})
//	}
//
// The SDK speaks the go-plugin handshake and kvtier plugin protocol version
// 1 (plugins/proto), maps the host's slab files at open (tiers/l2hugetlb's
// Attach, which holds the stack's slab lock shared) and hands the store a
// tiers.Env whose Slab is that mapping, relays Put acknowledgements to the
// host on a stream under the host's batch ids, and logs through a
// *slog.Logger whose JSON lines the host re-logs under the plugin's name.
// One plugin process serves one store or one index: the host starts a
// process per tier and calls Open once.
//
// A plugin must never write to stdout: stdout is the go-plugin handshake
// channel, and anything printed before the handshake makes the host refuse
// the plugin. Log to env.Logger (stderr) instead.
package sdk

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/goccy/go-yaml"
	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/plugins"
	"github.com/kvtier/kvtier/plugins/proto/indexv1"
	"github.com/kvtier/kvtier/plugins/proto/storev1"
	"github.com/kvtier/kvtier/tiers"
)

// StoreOpener opens the Store a plugin serves. env.Slab is the host's slab,
// already mapped; config is the plugin's block of the stack YAML as JSON
// ("null" when the YAML has none).
type StoreOpener func(ctx context.Context, env tiers.Env, config []byte) (tiers.Store, error)

// IndexOpener opens the Index a plugin serves; config as for StoreOpener.
type IndexOpener func(ctx context.Context, env indexes.Env, config []byte) (indexes.Index, error)

// Plugin describes what a plugin binary serves. At least one of OpenStore
// and OpenIndex must be set.
type Plugin struct {
	// Name names the implementation, e.g. "memstore"; the host logs it.
	Name string
	// Version is the implementation's version, for the host's logs.
	Version string
	// OpenStore opens the Store v1 the plugin serves, or is nil.
	OpenStore StoreOpener
	// OpenIndex opens the Index v1 the plugin serves, or is nil.
	OpenIndex IndexOpener
	// ServerOptions are added to the plugin's gRPC server, e.g.
	// interceptors for tracing or, in kvtier's own tests, fault
	// injection. Usually empty.
	ServerOptions []grpc.ServerOption
}

// maxMessageBytes bounds one gRPC message. Messages carry spans and keys,
// never page bytes, so this is generous; it only has to fit a long
// LongestPrefix chain or a large Iterate batch.
const maxMessageBytes = 64 << 20

// Serve serves p until the host closes the connection or kills the
// process. It exits the process with status 1 if p is empty, if the host
// offers no protocol version this SDK speaks (after logging both lists for
// the host to report), or if it was not started by a kvtier host.
func Serve(p Plugin) {
	logger := NewLogger(os.Stderr, levelFromEnv(os.Getenv("KVTIER_PLUGIN_LOG_LEVEL"))).With("impl", p.Name)
	if p.OpenStore == nil && p.OpenIndex == nil {
		logger.Error("kvtier plugin serves neither a store nor an index")
		os.Exit(1)
	}
	if host, ok, err := commonVersion(os.Getenv("PLUGIN_PROTOCOL_VERSIONS"), plugins.Versions()); err != nil || !ok {
		logger.Error(plugins.NoCommonVersionMessage,
			"host_versions", plugins.FormatVersions(host),
			"plugin_versions", plugins.FormatVersions(plugins.Versions()),
			"error", fmt.Sprint(err))
		os.Exit(1)
	}
	set := plugin.PluginSet{}
	var store *storeServer
	var index *indexServer
	if p.OpenStore != nil {
		store = newStoreServer(p, logger)
		set[plugins.StoreService] = &plugins.GRPCService{Register: func(s *grpc.Server) { storev1.RegisterStoreServer(s, store) }}
	}
	if p.OpenIndex != nil {
		index = newIndexServer(p, logger)
		set[plugins.IndexService] = &plugins.GRPCService{Register: func(s *grpc.Server) { indexv1.RegisterIndexServer(s, index) }}
	}
	go exitWithParent(logger)
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  plugins.Handshake(),
		VersionedPlugins: map[int]plugin.PluginSet{plugins.ProtocolVersion1: set},
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			opts = append(opts, grpc.MaxRecvMsgSize(maxMessageBytes), grpc.MaxSendMsgSize(maxMessageBytes))
			opts = append(opts, p.ServerOptions...)
			return grpc.NewServer(opts...)
		},
		Logger: hclogLogger(os.Stderr, p.Name),
	})
	// The host is gone or asked us to stop without Close: release what is
	// still open so buffered state reaches its files.
	if store != nil {
		store.shutdown()
	}
	if index != nil {
		index.shutdown()
	}
}

// commonVersion reports whether the host's offer (go-plugin's
// PLUGIN_PROTOCOL_VERSIONS, "1,2") shares a version with ours. An empty
// offer is accepted: go-plugin then falls back to the handshake's version.
func commonVersion(offer string, ours []int) (host []int, ok bool, err error) {
	if offer == "" {
		return nil, true, nil
	}
	host, err = plugins.ParseVersions(offer)
	if err != nil {
		return nil, false, err
	}
	for _, v := range host {
		if slices.Contains(ours, v) {
			return host, true, nil
		}
	}
	return host, false, nil
}

// exitWithParent ends the plugin when its host dies without killing it
// (the process is re-parented), so no orphan keeps slab files mapped.
func exitWithParent(logger *slog.Logger) {
	parent := os.Getppid()
	for range time.Tick(time.Second) {
		if os.Getppid() != parent {
			logger.Warn("kvtier host process is gone; plugin exits", "old_parent", parent)
			os.Exit(2)
		}
	}
}

// DecodeConfig decodes a plugin's config block strictly into dst: unknown
// fields are errors, as in every kvtier module config. The host sends the
// block as JSON, which is YAML, so it is decoded by the `yaml` struct tags
// a kvtier module config already has (snake_case keys). A config of "null"
// or nothing leaves dst (its defaults) as it is. If dst has a
// Validate() error method it is called.
func DecodeConfig(config []byte, dst any) error {
	trimmed := bytes.TrimSpace(config)
	if len(trimmed) != 0 && !bytes.Equal(trimmed, []byte("null")) {
		if trimmed[0] != '{' {
			return fmt.Errorf("plugin config: want a mapping, got %.40q", trimmed)
		}
		if err := yaml.UnmarshalWithOptions(trimmed, dst, yaml.DisallowUnknownField()); err != nil {
			return fmt.Errorf("plugin config: %w", err)
		}
	}
	if v, ok := dst.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return fmt.Errorf("plugin config: %w", err)
		}
	}
	return nil
}

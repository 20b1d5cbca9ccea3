// Package plugins holds what both ends of kvtier's out-of-process tier and
// index protocol agree on: the go-plugin handshake, the protocol versions, the
// names under which the Store v1 and Index v1 services are dispensed, and the
// go-plugin glue that carries a gRPC service.
//
// The host side lives in plugins/pluginhost, the plugin side in plugins/sdk,
// the wire contract in plugins/proto. This package must never carry page
// bytes: requests name slab spans, and the plugin maps the slab files.
package plugins

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

// ProtocolVersion1 is kvtier plugin protocol version 1: the services
// kvtier.store.v1.Store and kvtier.index.v1.Index of plugins/proto.
const ProtocolVersion1 = 1

// Versions returns the plugin protocol versions this build speaks, oldest
// first. The host offers all of them; go-plugin picks the newest one the
// plugin also speaks.
func Versions() []int { return []int{ProtocolVersion1} }

// Handshake returns the go-plugin handshake of kvtier plugins. The magic
// cookie is not a security measure: it makes a plugin binary started by hand
// say that it is meant to be started by kvtier.
func Handshake() plugin.HandshakeConfig {
	return plugin.HandshakeConfig{
		MagicCookieKey:   "KVTIER_PLUGIN",
		MagicCookieValue: "d6c1f1a4-kvtier-tier-plugin",
	}
}

// Names under which go-plugin dispenses the services of protocol version 1.
const (
	// StoreService is the dispense name of kvtier.store.v1.Store.
	StoreService = "store"
	// IndexService is the dispense name of kvtier.index.v1.Index.
	IndexService = "index"
)

// NoCommonVersionMessage is the message of the log line a kvtier SDK plugin
// writes to stderr, then exits, when the host offers no protocol version it
// speaks. Its fields host_versions and plugin_versions (comma-separated
// integers) let the host name both lists in its refusal.
const NoCommonVersionMessage = "kvtier plugin: no common protocol version"

// FormatVersions renders versions as "1,2,3", the form of the go-plugin
// PLUGIN_PROTOCOL_VERSIONS variable and of the fields above.
func FormatVersions(vs []int) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

// ParseVersions parses "1,2,3" into sorted versions.
func ParseVersions(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("protocol versions %q: %w", s, err)
		}
		out = append(out, v)
	}
	slices.Sort(out)
	return out, nil
}

// Conn is what the host side of GRPCService dispenses: the connection to
// the plugin and a context that go-plugin cancels when the plugin process
// exits (go-plugin has no exit callback; this is the closest thing).
type Conn struct {
	// Conn is the gRPC connection to the plugin process.
	Conn *grpc.ClientConn
	// Exited is cancelled when the plugin process has exited.
	Exited context.Context
}

// GRPCService adapts one gRPC service to go-plugin's GRPCPlugin. On the
// plugin side Register adds the service to the server; on the host side it
// is nil and the service dispenses a *Conn.
type GRPCService struct {
	plugin.NetRPCUnsupportedPlugin
	// Register adds the service's implementation to s (plugin side only).
	Register func(s *grpc.Server)
}

// GRPCServer registers the service (plugin side).
func (p *GRPCService) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	if p.Register != nil {
		p.Register(s)
	}
	return nil
}

// GRPCClient returns a *Conn (host side).
func (p *GRPCService) GRPCClient(exited context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &Conn{Conn: c, Exited: exited}, nil
}

// HostPluginSets returns the plugin sets the host offers, one per version.
func HostPluginSets() map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		ProtocolVersion1: {
			StoreService: &GRPCService{},
			IndexService: &GRPCService{},
		},
	}
}

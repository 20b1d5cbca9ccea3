// Package stack opens and closes a tier stack from config and registries.
// Today it holds the plugin wiring: turning a `plugin:` block of the stack
// config into the spec the plugin host starts (FromConfig). It sits above
// host/config and plugins/pluginhost so that neither imports the other; it
// must never hold tier or plugin logic itself, only the wiring between them.
package stack

import (
	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/plugins/pluginhost"
)

// FromConfig returns the plugin host's spec of a tier's or index's
// `plugin:` block as host/config loaded it; name is the tier's or index's
// name in the stack and opts the supervision options.
func FromConfig(name string, p config.PluginSpec, opts pluginhost.Options) pluginhost.PluginSpec {
	spec := pluginhost.PluginSpec{Name: name, Path: p.Path, SHA256: p.SHA256, Options: opts}
	if p.Config != nil {
		spec.Config = p.Config
	}
	return spec
}

// Package pluginhost runs kvtier tiers and indexes that third parties ship
// as plugin binaries, and makes them indistinguishable from in-process ones:
// OpenStore returns a tiers.Store and OpenIndex an indexes.Index backed by a
// supervised go-plugin subprocess.
//
// The host starts a binary only if its SHA-256 matches the one pinned in the
// stack config, negotiates the plugin protocol version, runs gRPC over
// AutoMTLS, and bridges the plugin's log lines into the host's slog logger
// under the plugin's name. Page bytes never cross gRPC: a Store plugin maps
// the host's slab files and requests carry spans.
//
// Supervision: a plugin that crashes, hangs past its call deadline or sends a
// malformed reply is marked down. While it is down, Store gets are misses,
// puts are failed writes (every item one AckFailed wrapping ErrDown and
// tiers.ErrBroken; items in flight when it died likewise), prefix probes
// answer 0, touches are skipped and deletes fail with ErrDown; index lookups
// report keys absent and index writes fail with ErrDown. All of it is
// counted in metrics and logged at most once per interval. A restarter brings the plugin back
// with exponential backoff behind a circuit breaker, and the host keeps
// serving throughout.
//
// A plugin runs as the leader of its own process group, and going down
// kills the whole group: a call that failed returns only once no process
// of the group can run, so a slow plugin never writes a Get destination or
// reads a Put source that the host has taken back. This package must never
// let a plugin failure panic or block the host beyond a call deadline (plus
// the moment a kill takes).
package pluginhost

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
)

// Sentinel errors callers branch on with errors.Is.
var (
	// ErrChecksum: the binary's SHA-256 is not the pinned one. The message
	// names both sums.
	ErrChecksum = errors.New("plugin checksum mismatch")
	// ErrNoCommonVersion: host and plugin speak no common protocol version.
	// The message names both lists.
	ErrNoCommonVersion = errors.New("no common plugin protocol version")
	// ErrHandshake: the plugin did not complete the go-plugin handshake
	// (it printed to stdout first, exited, or timed out).
	ErrHandshake = errors.New("plugin handshake failed")
	// ErrNoSlabMapping: a Store plugin could not map the host's slab files.
	// kvtier moves page bytes only through the shared slab, never over
	// gRPC, so such a plugin is refused.
	ErrNoSlabMapping = errors.New("store plugin cannot map the slab")
	// ErrDown: the plugin is down (crashed, hung, malformed, restarting).
	// Store results that carry it also wrap tiers.ErrMiss or
	// tiers.ErrBroken.
	ErrDown = errors.New("plugin down")
)

// PluginSpec is a tier's or an index's `plugin:` block of the stack config,
// plus the name the stack gives it and the supervision options (host/stack
// builds it from the loaded config with stack.FromConfig).
type PluginSpec struct {
	// Name is the tier's or index's name in the stack, used in logs and as
	// the "plugin" label of metrics.
	Name string
	// Path is the plugin binary.
	Path string
	// SHA256 is the binary's pinned SHA-256, 64 hex digits.
	SHA256 string
	// Config is the plugin's own config block, passed to it as JSON: a
	// []byte is YAML (as host/config keeps it) and is converted; any other
	// value is marshalled with encoding/json; nil sends "null".
	Config any
	// Options tunes start, call deadlines and restarts; zero fields take
	// defaults.
	Options Options
}

// configJSON encodes the spec's Config for the wire.
func (s PluginSpec) configJSON() ([]byte, error) {
	v := s.Config
	if b, ok := v.([]byte); ok {
		var decoded any
		if err := yaml.Unmarshal(b, &decoded); err != nil {
			return nil, fmt.Errorf("plugin %s: config is not YAML: %w", s.Name, err)
		}
		v = decoded
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: encode config as JSON: %w", s.Name, err)
	}
	return b, nil
}

// Validate checks the spec without touching the file system.
func (s PluginSpec) Validate() error {
	if s.Name == "" {
		return fmt.Errorf("plugin spec: name is empty")
	}
	if s.Path == "" {
		return fmt.Errorf("plugin %s: path is empty", s.Name)
	}
	if _, err := decodeSum(s.SHA256); err != nil {
		return fmt.Errorf("plugin %s: sha256: %w", s.Name, err)
	}
	return s.Options.withDefaults().Validate()
}

func decodeSum(s string) ([]byte, error) {
	b, err := hex.DecodeString(strings.TrimSpace(s))
	if err != nil || len(b) != 32 {
		return nil, fmt.Errorf("%q is not 64 hex digits (pin the binary with `sha256sum`)", s)
	}
	return b, nil
}

// Options tunes plugin supervision. The zero value means the defaults.
type Options struct {
	// StartTimeout bounds process start and the go-plugin handshake.
	// Default 10s.
	StartTimeout time.Duration
	// OpenTimeout bounds the Open call, in which a store may do real work
	// (a disk store preallocating its slot files, a load cold start
	// scanning them). Default 5m.
	OpenTimeout time.Duration
	// CallTimeout is the deadline of one call; a call past it marks the
	// plugin down (it hangs). Default 10s.
	CallTimeout time.Duration
	// CloseTimeout bounds Close, including the last acks. Default 10s.
	CloseTimeout time.Duration
	// AckTimeout is how long a Put item may wait for its terminal ack; a
	// plugin that leaves one longer is hung (its slab spans would never be
	// released) and is marked down. Default 2m.
	AckTimeout time.Duration
	// RestartBackoff is the first restart delay; it doubles per failed
	// attempt up to MaxRestartBackoff. Defaults 100ms and 30s.
	RestartBackoff, MaxRestartBackoff time.Duration
	// BreakerFailures consecutive failures (failed starts, or crashes
	// within StableAfter of starting) open the circuit breaker: no restart
	// for BreakerCooldown, then one trial. Defaults 5, 1m.
	BreakerFailures int
	// BreakerCooldown is how long the open breaker waits. Default 1m.
	BreakerCooldown time.Duration
	// StableAfter is how long a plugin must stay up for its failure count
	// to reset. Default 30s.
	StableAfter time.Duration
	// LogInterval is the least time between two logs of the same
	// condition (down, degraded operations). Default 10s.
	LogInterval time.Duration

	// hostVersions overrides the protocol versions the host offers, for
	// the negotiation tests; nil means plugins.Versions().
	hostVersions []int
}

// DefaultOptions returns the defaults.
func DefaultOptions() Options {
	return Options{
		StartTimeout:      10 * time.Second,
		OpenTimeout:       5 * time.Minute,
		CallTimeout:       10 * time.Second,
		CloseTimeout:      10 * time.Second,
		AckTimeout:        2 * time.Minute,
		RestartBackoff:    100 * time.Millisecond,
		MaxRestartBackoff: 30 * time.Second,
		BreakerFailures:   5,
		BreakerCooldown:   time.Minute,
		StableAfter:       30 * time.Second,
		LogInterval:       10 * time.Second,
	}
}

func (o Options) withDefaults() Options {
	d := DefaultOptions()
	set := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	set(&o.StartTimeout, d.StartTimeout)
	set(&o.OpenTimeout, d.OpenTimeout)
	set(&o.CallTimeout, d.CallTimeout)
	set(&o.CloseTimeout, d.CloseTimeout)
	set(&o.AckTimeout, d.AckTimeout)
	set(&o.RestartBackoff, d.RestartBackoff)
	set(&o.MaxRestartBackoff, d.MaxRestartBackoff)
	set(&o.BreakerCooldown, d.BreakerCooldown)
	set(&o.StableAfter, d.StableAfter)
	set(&o.LogInterval, d.LogInterval)
	if o.BreakerFailures == 0 {
		o.BreakerFailures = d.BreakerFailures
	}
	return o
}

// Validate checks that every duration is positive and the backoff range is
// ordered.
func (o Options) Validate() error {
	for name, v := range map[string]time.Duration{
		"start_timeout": o.StartTimeout, "open_timeout": o.OpenTimeout, "call_timeout": o.CallTimeout, "close_timeout": o.CloseTimeout, "ack_timeout": o.AckTimeout,
		"restart_backoff": o.RestartBackoff, "max_restart_backoff": o.MaxRestartBackoff,
		"breaker_cooldown": o.BreakerCooldown, "stable_after": o.StableAfter, "log_interval": o.LogInterval,
	} {
		if v <= 0 {
			return fmt.Errorf("plugin options: %s is %v, want > 0", name, v)
		}
	}
	if o.MaxRestartBackoff < o.RestartBackoff {
		return fmt.Errorf("plugin options: max_restart_backoff %v < restart_backoff %v", o.MaxRestartBackoff, o.RestartBackoff)
	}
	if o.BreakerFailures < 1 {
		return fmt.Errorf("plugin options: breaker_failures is %d, want >= 1", o.BreakerFailures)
	}
	return nil
}

// String renders the options in the form of the config keys.
func (o Options) String() string {
	return fmt.Sprintf("start_timeout=%v open_timeout=%v call_timeout=%v close_timeout=%v ack_timeout=%v restart_backoff=%v max_restart_backoff=%v breaker_failures=%d breaker_cooldown=%v stable_after=%v log_interval=%v",
		o.StartTimeout, o.OpenTimeout, o.CallTimeout, o.CloseTimeout, o.AckTimeout, o.RestartBackoff, o.MaxRestartBackoff, o.BreakerFailures, o.BreakerCooldown, o.StableAfter, o.LogInterval)
}

// backoff returns the delay before restart attempt n (0-based).
func (o Options) backoff(n int) time.Duration {
	d := o.RestartBackoff
	for i := 0; i < n && d < o.MaxRestartBackoff; i++ {
		d *= 2
	}
	return min(d, o.MaxRestartBackoff)
}

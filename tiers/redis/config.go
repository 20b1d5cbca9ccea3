package redis

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
)

// Modes of the server the store talks to.
const (
	// ModeCluster is Redis Cluster (or Valkey cluster): the addresses are
	// seed nodes; slots, MOVED/ASK and failover are followed.
	ModeCluster = "cluster"
	// ModeStandalone is one Redis server: the first and only address.
	ModeStandalone = "standalone"
)

// Limits of the config, sanity bounds that catch a unit mistake.
const (
	// MaxKeyPrefix bounds key_prefix, in bytes.
	MaxKeyPrefix = 128
	// MaxPipelineDepth bounds pipeline_depth.
	MaxPipelineDepth = 4096
	// MaxMinReplicas bounds min_replicas.
	MaxMinReplicas = 16
)

// TLS is the optional TLS block of the config. Files are read at open.
type TLS struct {
	// CAFile is a PEM bundle of the CAs that sign the servers'
	// certificates; empty means the system pool.
	CAFile string `yaml:"ca_file,omitempty"`
	// CertFile and KeyFile are the client certificate and key (PEM) for
	// servers that require mutual TLS; both or neither.
	CertFile string `yaml:"cert_file,omitempty"`
	KeyFile  string `yaml:"key_file,omitempty"`
	// ServerName overrides the name checked in the servers' certificates.
	ServerName string `yaml:"server_name,omitempty"`
	// InsecureSkipVerify turns certificate verification off (tests only).
	InsecureSkipVerify bool `yaml:"insecure_skip_verify,omitempty"`
}

// Config is the redis tier's YAML block.
type Config struct {
	// Mode is "cluster" (default) or "standalone".
	Mode string `yaml:"mode"`
	// Addresses are host:port pairs: the seed nodes of a cluster, or the
	// one server of a standalone Redis. Required.
	Addresses []string `yaml:"addresses"`
	// Username is the ACL user; empty means the default user.
	Username string `yaml:"username,omitempty"`
	// PasswordFile names a file whose content (one line; a trailing
	// newline is dropped) is the password. The secret itself is never in
	// the config. Empty means no AUTH.
	PasswordFile string `yaml:"password_file,omitempty"`
	// TLS, if set, connects over TLS.
	TLS *TLS `yaml:"tls,omitempty"`
	// KeyPrefix starts every key. It carries the stack's namespace (model,
	// layout, dtype, page size), so that two stacks sharing a cluster never
	// read each other's pages: e.g. "kvtier:llama3-70b:bf16:p64:". It must
	// not contain '{' or '}' (a hash tag would put every page in one slot)
	// or whitespace.
	KeyPrefix string `yaml:"key_prefix"`
	// PipelineDepth is the number of pages one pipelined round trip
	// carries (default 8: 22 MiB for 2.75 MiB pages). A put has at most
	// four such chunks out at once (two on the wire, two waiting for a
	// sender), each payload sent straight from the slab.
	PipelineDepth int `yaml:"pipeline_depth"`
	// DialTimeout bounds connecting to a node (default 1s).
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// Timeout bounds every call (a Get, a prefix probe, a touch, a delete)
	// and every pipelined round trip of a put: pages on a node that is down
	// miss, and its puts fail, within it; nothing hangs (default 5s). Keep
	// it under a plugin host's call deadline (10s).
	Timeout time.Duration `yaml:"timeout"`
	// TTL, if positive, expires pages that long after their last put,
	// touch or hit; 0 keeps them until the server's maxmemory-policy
	// evicts them.
	TTL time.Duration `yaml:"ttl,omitempty"`
	// MinReplicas, if positive, makes a put durable only once that many
	// replicas of the page's master confirmed it (WAIT); fewer in time is
	// a failed put.
	MinReplicas int `yaml:"min_replicas,omitempty"`
	// ReplicaTimeout bounds the WAIT for MinReplicas (default 1s).
	ReplicaTimeout time.Duration `yaml:"replica_timeout,omitempty"`
}

// DefaultConfig returns a config with every default set and no addresses.
func DefaultConfig() Config {
	return Config{
		Mode:           ModeCluster,
		KeyPrefix:      "kvtier:",
		PipelineDepth:  8,
		DialTimeout:    time.Second,
		Timeout:        5 * time.Second,
		ReplicaTimeout: time.Second,
	}
}

// Validate checks the config on its own; files are read at Open.
func (c *Config) Validate() error {
	var errs []error
	switch c.Mode {
	case ModeCluster, ModeStandalone:
	default:
		errs = append(errs, fmt.Errorf("mode: %q, want cluster or standalone", c.Mode))
	}
	if len(c.Addresses) == 0 {
		errs = append(errs, errors.New("addresses: at least one host:port is required"))
	}
	if c.Mode == ModeStandalone && len(c.Addresses) > 1 {
		errs = append(errs, fmt.Errorf("addresses: %d given, a standalone server takes exactly one", len(c.Addresses)))
	}
	seen := map[string]int{}
	for i, a := range c.Addresses {
		if err := checkAddress(a); err != nil {
			errs = append(errs, fmt.Errorf("addresses[%d]: %w", i, err))
		}
		if j, ok := seen[a]; ok {
			errs = append(errs, fmt.Errorf("addresses[%d]: %q repeats addresses[%d]", i, a, j))
		}
		seen[a] = i
	}
	if err := checkKeyPrefix(c.KeyPrefix); err != nil {
		errs = append(errs, fmt.Errorf("key_prefix: %w", err))
	}
	if c.PipelineDepth < 1 || c.PipelineDepth > MaxPipelineDepth {
		errs = append(errs, fmt.Errorf("pipeline_depth: %d, want 1..%d", c.PipelineDepth, MaxPipelineDepth))
	}
	if c.DialTimeout <= 0 {
		errs = append(errs, fmt.Errorf("dial_timeout: %v, want positive", c.DialTimeout))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("timeout: %v, want positive", c.Timeout))
	}
	if c.TTL < 0 {
		errs = append(errs, fmt.Errorf("ttl: %v is negative (0 means no expiry)", c.TTL))
	} else if c.TTL > 0 && c.TTL < time.Millisecond {
		errs = append(errs, fmt.Errorf("ttl: %v, want 0 or at least 1ms", c.TTL))
	}
	if c.MinReplicas < 0 || c.MinReplicas > MaxMinReplicas {
		errs = append(errs, fmt.Errorf("min_replicas: %d, want 0..%d", c.MinReplicas, MaxMinReplicas))
	}
	if c.MinReplicas > 0 && c.ReplicaTimeout < time.Millisecond {
		errs = append(errs, fmt.Errorf("replica_timeout: %v, want at least 1ms when min_replicas is set", c.ReplicaTimeout))
	}
	if c.MinReplicas > 0 && c.ReplicaTimeout >= c.Timeout {
		errs = append(errs, fmt.Errorf("replica_timeout %v must be shorter than timeout %v", c.ReplicaTimeout, c.Timeout))
	}
	if strings.ContainsAny(c.PasswordFile, "\n\x00") {
		errs = append(errs, errors.New("password_file: a path, not a secret (it contains a newline or NUL)"))
	}
	if t := c.TLS; t != nil && (t.CertFile == "") != (t.KeyFile == "") {
		errs = append(errs, errors.New("tls: cert_file and key_file go together"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("redis config: %w", errors.Join(errs...))
	}
	return nil
}

func checkAddress(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("%q: want host:port: %w", a, err)
	}
	if host == "" {
		return fmt.Errorf("%q: empty host", a)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%q: port %q, want 1..65535", a, port)
	}
	return nil
}

func checkKeyPrefix(p string) error {
	if p == "" {
		return errors.New("empty; it carries the stack's namespace")
	}
	if len(p) > MaxKeyPrefix {
		return fmt.Errorf("%d bytes, at most %d", len(p), MaxKeyPrefix)
	}
	for i := 0; i < len(p); i++ {
		switch b := p[i]; {
		case b == '{' || b == '}':
			return fmt.Errorf("%q: '%c' at byte %d would make a hash tag and put every page in one cluster slot", p, b, i)
		case b <= ' ' || b >= 0x7f:
			return fmt.Errorf("%q: byte %d is %#02x, want printable ASCII without spaces", p, i, b)
		}
	}
	return nil
}

// String returns the config as YAML, which decodes back to the same value.
func (c Config) String() string {
	b, err := yaml.Marshal(c)
	if err != nil {
		return fmt.Sprintf("redis config: %v", err)
	}
	return string(b)
}

// DecodeConfig decodes a YAML (or JSON) block strictly into a defaulted
// Config and validates it. It is what a plugin and a test use; the host's
// loader does the same through the registration.
func DecodeConfig(b []byte) (Config, error) {
	c := DefaultConfig()
	if len(strings.TrimSpace(string(b))) != 0 {
		if err := yaml.UnmarshalWithOptions(b, &c, yaml.DisallowUnknownField()); err != nil {
			return Config{}, fmt.Errorf("redis config: %w", err)
		}
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

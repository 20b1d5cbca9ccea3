package redis_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/redis"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

func TestDecodeConfig(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       string // substring of the error; "" means valid
	}{
		{"cluster", `{addresses: ["10.0.0.1:6379", "10.0.0.2:6379"], key_prefix: "kv:llama:"}`, ""},
		{"standalone with everything", `{mode: standalone, addresses: ["[::1]:6380"], key_prefix: "p:", pipeline_depth: 8,
			dial_timeout: 250ms, timeout: 2s, ttl: 1h, password_file: /run/secrets/redis, username: kv,
			tls: {ca_file: /etc/ca.pem, server_name: redis.internal}}`, ""},
		{"durable", `{addresses: ["a:1"], min_replicas: 2, replica_timeout: 100ms}`, ""},
		{"no addresses", `{key_prefix: "x:"}`, "addresses: at least one"},
		{"unknown field", `{addresses: ["a:1"], password: hunter2}`, "password"},
		{"bad mode", `{mode: sentinel, addresses: ["a:1"]}`, `mode: "sentinel"`},
		{"two standalone addresses", `{mode: standalone, addresses: ["a:1", "b:2"]}`, "exactly one"},
		{"no port", `{addresses: ["redis.internal"]}`, "addresses[0]"},
		{"port zero", `{addresses: ["a:0"]}`, "addresses[0]"},
		{"repeated address", `{addresses: ["a:1", "a:1"]}`, "addresses[1]: \"a:1\" repeats"},
		{"hash tag in prefix", `{addresses: ["a:1"], key_prefix: "kv{x}:"}`, "hash tag"},
		{"space in prefix", `{addresses: ["a:1"], key_prefix: "kv x"}`, "key_prefix"},
		{"empty prefix", `{addresses: ["a:1"], key_prefix: ""}`, "key_prefix: empty"},
		{"long prefix", `{addresses: ["a:1"], key_prefix: "` + strings.Repeat("k", 129) + `"}`, "at most 128"},
		{"pipeline depth 0", `{addresses: ["a:1"], pipeline_depth: 0}`, "pipeline_depth"},
		{"negative timeout", `{addresses: ["a:1"], timeout: -1s}`, "timeout"},
		{"negative ttl", `{addresses: ["a:1"], ttl: -5m}`, "ttl"},
		{"sub-ms ttl", `{addresses: ["a:1"], ttl: 10us}`, "ttl"},
		{"too many replicas", `{addresses: ["a:1"], min_replicas: 99}`, "min_replicas"},
		{"replica timeout not below timeout", `{addresses: ["a:1"], min_replicas: 1, replica_timeout: 10s, timeout: 1s}`, "replica_timeout"},
		{"secret in password_file", "{addresses: [\"a:1\"], password_file: \"hunter2\\nx\"}", "password_file"},
		{"half a client cert", `{addresses: ["a:1"], tls: {cert_file: c.pem}}`, "cert_file and key_file"},
		{"not a mapping", `[1, 2]`, "redis config"},
		{"wrong type", `{addresses: "a:1"}`, "redis config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := redis.DecodeConfig([]byte(tc.yaml))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("valid config refused: %v", err)
				}
				// String round-trips.
				c2, err := redis.DecodeConfig([]byte(c.String()))
				if err != nil {
					t.Fatalf("printed config does not decode: %v\n%s", err, c)
				}
				if c2.String() != c.String() {
					t.Fatalf("round trip changed the config:\n%s\n---\n%s", c, c2)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestDefaultConfigString(t *testing.T) {
	c := redis.DefaultConfig()
	c.Addresses = []string{"127.0.0.1:7000"}
	c.TTL = 90 * time.Minute
	got, err := redis.DecodeConfig([]byte(c.String()))
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != c.String() || got.TTL != c.TTL || got.Timeout != c.Timeout {
		t.Fatalf("round trip: %+v, want %+v", got, c)
	}
}

// TestOpenErrors checks the errors of Open that come before any server is
// contacted: each names the file or field at fault.
func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	twoLines := filepath.Join(dir, "two")
	notPEM := filepath.Join(dir, "ca.pem")
	for p, body := range map[string]string{empty: "\n", twoLines: "a\nb\n", notPEM: "not a certificate"} {
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	g := geometry()
	slab := tiertest.NewHeapSlab(1 << 20)
	env := tiers.Env{Logger: slog.New(slog.DiscardHandler), Payload: g, WorldSize: 1, Slab: slab}
	base := redis.DefaultConfig()
	base.Addresses = []string{"127.0.0.1:1"}
	for _, tc := range []struct {
		name string
		edit func(*redis.Config, *tiers.Env)
		want string
	}{
		{"invalid config", func(c *redis.Config, _ *tiers.Env) { c.Addresses = nil }, "addresses"},
		{"no slab", func(_ *redis.Config, e *tiers.Env) { e.Slab = nil }, "no slab"},
		{"no logger", func(_ *redis.Config, e *tiers.Env) { e.Logger = nil }, "logger"},
		{"missing password file", func(c *redis.Config, _ *tiers.Env) { c.PasswordFile = filepath.Join(dir, "nope") }, "password_file"},
		{"empty password file", func(c *redis.Config, _ *tiers.Env) { c.PasswordFile = empty }, "is empty"},
		{"two-line password file", func(c *redis.Config, _ *tiers.Env) { c.PasswordFile = twoLines }, "more than one line"},
		{"ca file without PEM", func(c *redis.Config, _ *tiers.Env) { c.TLS = &redis.TLS{CAFile: notPEM} }, "tls.ca_file"},
		{"missing client cert", func(c *redis.Config, _ *tiers.Env) {
			c.TLS = &redis.TLS{CertFile: filepath.Join(dir, "c"), KeyFile: filepath.Join(dir, "k")}
		}, "tls.cert_file"},
		{"nothing listening", func(c *redis.Config, _ *tiers.Env) { c.Timeout = 500 * time.Millisecond }, "127.0.0.1:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, e := base, env
			tc.edit(&c, &e)
			st, err := redis.Open(context.Background(), e, c)
			if err == nil {
				st.Close()
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestRegister(t *testing.T) {
	r := tiers.NewRegistry()
	if err := redis.Register(r); err != nil {
		t.Fatal(err)
	}
	if err := redis.Register(r); err == nil {
		t.Fatal("second registration: no error")
	}
	cfg, err := r.NewConfig(tiers.StoreV1, redis.Name)
	if err != nil {
		t.Fatal(err)
	}
	c, ok := cfg.(*redis.Config)
	if !ok || c.PipelineDepth != redis.DefaultConfig().PipelineDepth {
		t.Fatalf("NewConfig = %#v, want a defaulted *redis.Config", cfg)
	}
	reg, err := r.Stores.Lookup(tiers.StoreV1, redis.Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Factory(context.Background(), tiers.Env{}, 42); err == nil || !strings.Contains(err.Error(), "redis") {
		t.Fatalf("factory with a foreign config: %v", err)
	}
	// A failed open returns a nil interface, not a nil *Store inside one.
	if st, err := reg.Factory(context.Background(), tiers.Env{}, nil); err == nil || st != nil {
		t.Fatalf("factory that cannot open: %v, %v; want nil and an error", st, err)
	}
}

// FuzzDecodeConfig: any bytes decode to a valid config or an error, never
// a panic, and a valid config prints and decodes to itself.
func FuzzDecodeConfig(f *testing.F) {
	for _, s := range []string{
		`{addresses: ["a:1"]}`, `{mode: standalone, addresses: ["[::1]:6380"], ttl: 1h, tls: {ca_file: x}}`,
		`{addresses: ["a:1"], min_replicas: 1, replica_timeout: 5ms}`, `null`, ``, `{`, `{addresses: [1]}`,
		`{key_prefix: "{"}`, `pipeline_depth: 99999999999999999999`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := redis.DecodeConfig(b)
		if err != nil {
			return
		}
		c2, err := redis.DecodeConfig([]byte(c.String()))
		if err != nil {
			t.Fatalf("valid config %q prints as %q, which does not decode: %v", b, c.String(), err)
		}
		if c2.String() != c.String() {
			t.Fatalf("round trip of %q changed it:\n%s\n---\n%s", b, c, c2)
		}
	})
}

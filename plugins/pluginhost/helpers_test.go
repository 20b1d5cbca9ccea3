package pluginhost

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/internal/slabfile"
	"github.com/kvtier/kvtier/tiers"
)

// binDir holds the plugin binaries this test run builds.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvtier-plugin-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var (
	buildMu    sync.Mutex
	builtPaths = map[string]string{}
)

// pluginBinary builds the plugin main package pkg (relative to the module
// root) once per test run and returns its path and SHA-256.
func pluginBinary(t *testing.T, pkg string) (path, sum string) {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := builtPaths[pkg]; ok {
		return p, fileSumHex(t, p)
	}
	root := moduleRoot(t)
	out := filepath.Join(binDir, strings.ReplaceAll(pkg, "/", "_"))
	cmd := exec.Command("go", "build", "-o", out, "./"+pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, b)
	}
	builtPaths[pkg] = out
	return out, fileSumHex(t, out)
}

func fileSumHex(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test directory")
		}
		dir = parent
	}
}

// testPayload has two kinds of page sizes that are not powers of two.
func testPayload() tiers.PayloadGeometry {
	return tiers.PayloadGeometry{PageTokens: 16, Kinds: []tiers.PayloadSpec{
		{Name: "kv", PageBytes: 12 << 10},
		{Name: "index", PageBytes: 3000},
	}}
}

// newSlab makes a file-backed slab a plugin process can map.
func newSlab(t *testing.T, size int64) tiers.Slab {
	t.Helper()
	dir := "/dev/shm"
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		dir = t.TempDir()
	}
	s, err := slabfile.Open(context.Background(), nil, dir, "test-stack", size, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// logBuffer is a concurrency-safe log sink for assertions on log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func testLogger(t *testing.T, w io.Writer) *slog.Logger {
	t.Helper()
	if w == nil {
		w = io.Discard
		if testing.Verbose() {
			w = os.Stderr
		}
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func storeEnv(t *testing.T, slab tiers.Slab, logs io.Writer) tiers.Env {
	return tiers.Env{
		Logger: testLogger(t, logs), Payload: testPayload(), Rank: 0, WorldSize: 1,
		StackID: "test-stack", Slab: slab, ColdStart: tiers.ColdStartClear,
	}
}

// fastOptions keeps supervision tests quick.
func fastOptions() Options {
	return Options{
		StartTimeout: 20 * time.Second, CallTimeout: 5 * time.Second, CloseTimeout: 5 * time.Second,
		RestartBackoff: 20 * time.Millisecond, MaxRestartBackoff: 200 * time.Millisecond,
		BreakerFailures: 100, BreakerCooldown: time.Second, StableAfter: time.Minute, LogInterval: time.Second,
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (s *Store) up() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen != nil
}

func (s *Store) pid() int { return s.PID() }

func (x *Index) up() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.gen != nil
}

func (x *Index) pid() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.gen == nil {
		return 0
	}
	return x.gen.proc.pid
}

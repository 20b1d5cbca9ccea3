package pluginhost

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/kvtier/kvtier/plugins"
)

// maxMessageBytes bounds one gRPC message (spans and keys, never pages).
const maxMessageBytes = 64 << 20

// reapWait bounds how long the host waits, after SIGKILL, for a plugin's
// process group to be gone; pipeWait bounds how long it then waits for
// go-plugin to read the plugin's stdout and stderr to their end and reap
// it (a process that left the group may still hold them).
const (
	reapWait = 5 * time.Second
	pipeWait = time.Second
)

// process is one running plugin process, its process group and its
// connection.
type process struct {
	client  *plugin.Client
	conn    *grpc.ClientConn
	exited  context.Context // cancelled when the process has exited
	version int
	pid     int // also its process group id (Setpgid)
	notes   *bridgeNotes
	logger  *slog.Logger

	// cancelCmd cancels the exec.Cmd's context: exec then kills the
	// process group (cmd.Cancel), even while go-plugin is still waiting
	// for the handshake and the host does not know the pid yet.
	cancelCmd context.CancelFunc
	killOnce  sync.Once
}

// launch checks the binary's checksum, starts it through go-plugin with
// AutoMTLS and version negotiation, and dispenses service. Cancelling ctx
// abandons a start in progress: the plugin's process group is killed at
// once, even in the middle of the handshake, and launch returns an error
// wrapping ctx's.
func launch(ctx context.Context, spec PluginSpec, opts Options, service string, logger *slog.Logger) (*process, error) {
	want, err := decodeSum(spec.SHA256)
	if err != nil {
		return nil, fmt.Errorf("plugin %s (%s): sha256: %w", spec.Name, spec.Path, err)
	}
	// NB: an absolute path, so that the file hashed is the file executed
	// (exec.Command would search $PATH for a bare name).
	path, err := filepath.Abs(spec.Path)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: path %s: %w", spec.Name, spec.Path, err)
	}
	// go-plugin's SecureConfig check says only "checksums did not match";
	// check first ourselves so the refusal names both sums. SecureConfig
	// still checks again right before exec.
	got, err := fileSum(path)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w", spec.Name, err)
	}
	if !bytes.Equal(got, want) {
		return nil, fmt.Errorf("plugin %s (%s): %w: pinned sha256 %s, binary has %s",
			spec.Name, spec.Path, ErrChecksum, hex.EncodeToString(want), hex.EncodeToString(got))
	}
	bridge := newSlogBridge(logger)
	cmdCtx, cancelCmd := context.WithCancel(context.Background())
	cmd := exec.CommandContext(cmdCtx, path)
	// go-plugin appends the host's environment and its handshake variables.
	cmd.Env = []string{"KVTIER_PLUGIN_NAME=" + spec.Name}
	// The plugin must not die with the host's terminal signals before the
	// host has flushed it; the host kills it explicitly. Its own process
	// group lets the host kill it with every process it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// NB: exec calls Cancel only after Start, with cmd.Process set.
	cmd.Cancel = func() error { return killGroup(cmd.Process.Pid) }
	// NB: WaitDelay bounds exec's own wait for the pipes once Wait runs;
	// go-plugin drains stdout and stderr before it calls Wait, so the host
	// bounds that drain itself (process.kill, pipeWait).
	cmd.WaitDelay = pipeWait
	abandon := context.AfterFunc(ctx, cancelCmd)
	defer abandon()
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  plugins.Handshake(),
		VersionedPlugins: hostSets(opts.hostVersions),
		Cmd:              cmd,
		SecureConfig:     &plugin.SecureConfig{Checksum: want, Hash: sha256.New()},
		AutoMTLS:         true,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		StartTimeout:     opts.StartTimeout,
		Logger:           bridge,
		Stderr:           io.Discard,
		SyncStdout:       io.Discard,
		SyncStderr:       io.Discard,
		GRPCDialOptions: []grpc.DialOption{grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(maxMessageBytes), grpc.MaxCallSendMsgSize(maxMessageBytes))},
	})
	rpc, err := client.Client()
	// NB: Client returned, so cmd.Start has (or has not) run: cmd.Process
	// is safe to read here.
	p := &process{client: client, notes: bridge.notes, logger: logger, cancelCmd: cancelCmd}
	if cmd.Process != nil {
		p.pid = cmd.Process.Pid
	}
	if err != nil {
		// kill waits for go-plugin's stderr reader, so every line the
		// plugin wrote is in the notes before we read them.
		p.kill()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("plugin %s (%s): start abandoned: %w", spec.Name, spec.Path, context.Cause(ctx))
		}
		return nil, startError(spec, err, bridge.notes)
	}
	raw, err := rpc.Dispense(service)
	if err != nil {
		p.kill()
		return nil, fmt.Errorf("plugin %s: dispense %s: %w", spec.Name, service, err)
	}
	c, ok := raw.(*plugins.Conn)
	if !ok {
		p.kill()
		return nil, fmt.Errorf("plugin %s: dispense %s returned %T", spec.Name, service, raw)
	}
	p.conn, p.exited, p.version = c.Conn, c.Exited, client.NegotiatedVersion()
	return p, nil
}

// hostSets returns the plugin sets the host offers: all it speaks, or, in
// tests, the given versions.
func hostSets(versions []int) map[int]plugin.PluginSet {
	sets := plugins.HostPluginSets()
	if versions == nil {
		return sets
	}
	out := make(map[int]plugin.PluginSet, len(versions))
	for _, v := range versions {
		out[v] = sets[plugins.ProtocolVersion1]
	}
	return out
}

// kill ends the process and its whole process group at once (a broken
// plugin gets no grace period) and returns once none of them can run any
// more, or after reapWait (logged). Then it lets go-plugin reap the
// process and stop its goroutines, for at most pipeWait. Concurrent and
// later calls return when the first one does.
func (p *process) kill() {
	p.killOnce.Do(func() {
		if p.pid > 0 {
			if err := killGroup(p.pid); err != nil {
				p.logger.Error("cannot kill the plugin's process group", "pid", p.pid, "error", err)
			}
		}
		p.cancelCmd()
		if p.pid > 0 && !awaitGroupGone(p.pid, reapWait) {
			p.logger.Error("plugin process group still running after SIGKILL", "pgid", p.pid, "waited", reapWait)
		}
		p.release(pipeWait)
	})
}

// release lets go-plugin reap the process, read its pipes to the end and
// stop its goroutines, waiting at most d: a process that left the group
// may still hold the pipes, and go-plugin reads them until it closes them.
func (p *process) release(d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		p.client.Kill()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		p.logger.Warn("go-plugin has not let go of the plugin process (graceful exit pending, or its pipes held open); not waiting longer", "pid", p.pid, "waited", d)
		return false
	}
}

// stop asks the plugin to shut down gracefully, waiting at most d (go-plugin
// itself kills the plugin's pid after two seconds), then kills whatever is
// left of its process group.
func (p *process) stop(d time.Duration) {
	p.release(d)
	p.kill()
}

func fileSum(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open plugin binary: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, fmt.Errorf("hash plugin binary %s: %w", path, err)
	}
	return h.Sum(nil), nil
}

var (
	goPluginVersionRE = regexp.MustCompile(`Plugin version: (\d+)`)
	unrecognizedRE    = regexp.MustCompile(`Unrecognized remote plugin message: ?(.*)`)
)

// startError turns go-plugin's start failure into a refusal that says what
// happened and what to do.
func startError(spec PluginSpec, err error, notes *bridgeNotes) error {
	msg := err.Error()
	offered := spec.Options.hostVersions
	if offered == nil {
		offered = plugins.Versions()
	}
	host := plugins.FormatVersions(offered)
	if h, p, ok := notes.versions(); ok {
		if h == "" {
			h = host
		}
		return fmt.Errorf("plugin %s (%s): %w: host speaks [%s], plugin speaks [%s]", spec.Name, spec.Path, ErrNoCommonVersion, h, p)
	}
	if m := goPluginVersionRE.FindStringSubmatch(msg); m != nil && strings.Contains(msg, "incompatible API version") {
		// A plugin not built with the SDK: go-plugin reports only the
		// newest version the plugin speaks.
		return fmt.Errorf("plugin %s (%s): %w: host speaks [%s], plugin speaks [%s] (its newest; it listed no others)", spec.Name, spec.Path, ErrNoCommonVersion, host, m[1])
	}
	if errors.Is(err, plugin.ErrChecksumsDoNotMatch) {
		return fmt.Errorf("plugin %s (%s): %w: the binary changed after it was hashed", spec.Name, spec.Path, ErrChecksum)
	}
	last := notes.lastLines()
	if last != "" {
		last = " (plugin said: " + last + ")"
	}
	if m := unrecognizedRE.FindStringSubmatch(msg); m != nil {
		line := strings.SplitN(m[1], "\n", 2)[0]
		if line == "" {
			return fmt.Errorf("plugin %s (%s): %w: it exited before the handshake%s", spec.Name, spec.Path, ErrHandshake, last)
		}
		return fmt.Errorf("plugin %s (%s): %w: it wrote %q to stdout before the handshake; stdout is the go-plugin handshake channel, so a plugin must log to stderr%s",
			spec.Name, spec.Path, ErrHandshake, line, last)
	}
	if strings.Contains(msg, "timeout while waiting for plugin to start") {
		return fmt.Errorf("plugin %s (%s): %w: no handshake within %v%s", spec.Name, spec.Path, ErrHandshake, spec.Options.withDefaults().StartTimeout, last)
	}
	if strings.Contains(msg, "exited before we could connect") {
		return fmt.Errorf("plugin %s (%s): %w: it exited before the handshake%s", spec.Name, spec.Path, ErrHandshake, last)
	}
	return fmt.Errorf("plugin %s (%s): %w: %w%s", spec.Name, spec.Path, ErrHandshake, err, last)
}

// callCtx derives a call context with the plugin's call deadline.
func callCtx(ctx context.Context, opts Options) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, opts.CallTimeout)
}

// sinceStart is how long a process has been up; a helper so the
// supervisor's crash-loop rule reads plainly.
func sinceStart(t time.Time) time.Duration { return time.Since(t) }

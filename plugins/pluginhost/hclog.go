package pluginhost

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"
	"sync"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/kvtier/kvtier/plugins"
)

// slogBridge is an hclog.Logger that writes to a *slog.Logger. go-plugin logs
// its own messages and every line the plugin writes to stderr through it;
// JSON lines from the SDK arrive with their level and fields.
//
// It also remembers, for error messages, the plugin's last warnings and
// errors and its "no common protocol version" line.
type slogBridge struct {
	l     *slog.Logger
	name  string
	args  []any
	notes *bridgeNotes
}

type bridgeNotes struct {
	mu             sync.Mutex
	last           []string // the plugin's last warn/error messages
	hostVersions   string
	pluginVersions string

	// A plugin that floods stderr is cut to maxLinesPerSecond lines a
	// second; the first line of the next second says how many were dropped.
	window  time.Time
	lines   int
	dropped int
}

// maxLinesPerSecond bounds the plugin lines re-logged per second.
const maxLinesPerSecond = 200

// admit reports whether a plugin line may be logged now, and how many lines
// were dropped before it (to report once).
func (n *bridgeNotes) admit(now time.Time) (ok bool, dropped int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if now.Sub(n.window) >= time.Second {
		n.window, n.lines = now, 0
		dropped, n.dropped = n.dropped, 0
	}
	if n.lines >= maxLinesPerSecond {
		n.dropped++
		return false, 0
	}
	n.lines++
	return true, dropped
}

const keepLastLines = 4

func newSlogBridge(l *slog.Logger) *slogBridge {
	return &slogBridge{l: l, notes: &bridgeNotes{}}
}

func (n *bridgeNotes) note(level hclog.Level, msg string, args []any) {
	if level < hclog.Warn && msg != plugins.NoCommonVersionMessage {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if msg == plugins.NoCommonVersionMessage {
		for i := 0; i+1 < len(args); i += 2 {
			switch args[i] {
			case "host_versions":
				n.hostVersions = fmt.Sprint(args[i+1])
			case "plugin_versions":
				n.pluginVersions = fmt.Sprint(args[i+1])
			}
		}
	}
	line := msg
	for i := 0; i+1 < len(args); i += 2 {
		if k, ok := args[i].(string); ok && (k == "error" || k == "err") {
			line += ": " + fmt.Sprint(args[i+1])
		}
	}
	n.last = append(n.last, line)
	if len(n.last) > keepLastLines {
		n.last = n.last[len(n.last)-keepLastLines:]
	}
}

// lastLines returns the remembered warn/error lines, "; "-joined.
func (n *bridgeNotes) lastLines() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return strings.Join(n.last, "; ")
}

// versions returns the lists of a "no common protocol version" line.
func (n *bridgeNotes) versions() (host, plugin string, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.hostVersions, n.pluginVersions, n.pluginVersions != ""
}

func slogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}

// Log implements hclog.Logger.
func (b *slogBridge) Log(level hclog.Level, msg string, args ...any) {
	lvl := slogLevel(level)
	ctx := context.Background()
	if b.name != "" {
		// Only lines from the plugin process go through a named logger
		// (go-plugin names it after the binary).
		b.notes.note(level, msg, args)
		ok, dropped := b.notes.admit(time.Now())
		if !ok {
			return
		}
		if dropped > 0 {
			b.l.Warn("plugin log lines dropped (rate limit)", "dropped", dropped, "limit_per_second", maxLinesPerSecond)
		}
	}
	if !b.l.Enabled(ctx, lvl) {
		return
	}
	all := make([]any, 0, len(b.args)+len(args)+2)
	all = append(all, b.args...)
	all = append(all, args...)
	if len(all)%2 == 1 {
		all = append(all, "(missing)")
	}
	if b.name != "" {
		all = append(all, "source", b.name)
	}
	b.l.Log(ctx, lvl, msg, all...)
}

// Trace implements hclog.Logger.
func (b *slogBridge) Trace(msg string, args ...any) { b.Log(hclog.Trace, msg, args...) }

// Debug implements hclog.Logger.
func (b *slogBridge) Debug(msg string, args ...any) { b.Log(hclog.Debug, msg, args...) }

// Info implements hclog.Logger.
func (b *slogBridge) Info(msg string, args ...any) { b.Log(hclog.Info, msg, args...) }

// Warn implements hclog.Logger.
func (b *slogBridge) Warn(msg string, args ...any) { b.Log(hclog.Warn, msg, args...) }

// Error implements hclog.Logger.
func (b *slogBridge) Error(msg string, args ...any) { b.Log(hclog.Error, msg, args...) }

// IsTrace implements hclog.Logger.
func (b *slogBridge) IsTrace() bool { return b.l.Enabled(context.Background(), slogLevel(hclog.Trace)) }

// IsDebug implements hclog.Logger.
func (b *slogBridge) IsDebug() bool { return b.l.Enabled(context.Background(), slog.LevelDebug) }

// IsInfo implements hclog.Logger.
func (b *slogBridge) IsInfo() bool { return b.l.Enabled(context.Background(), slog.LevelInfo) }

// IsWarn implements hclog.Logger.
func (b *slogBridge) IsWarn() bool { return b.l.Enabled(context.Background(), slog.LevelWarn) }

// IsError implements hclog.Logger.
func (b *slogBridge) IsError() bool { return b.l.Enabled(context.Background(), slog.LevelError) }

// ImpliedArgs implements hclog.Logger.
func (b *slogBridge) ImpliedArgs() []any { return b.args }

// With implements hclog.Logger.
func (b *slogBridge) With(args ...any) hclog.Logger {
	c := *b
	c.args = append(append([]any(nil), b.args...), args...)
	return &c
}

// Name implements hclog.Logger.
func (b *slogBridge) Name() string { return b.name }

// Named implements hclog.Logger.
func (b *slogBridge) Named(name string) hclog.Logger {
	c := *b
	if c.name != "" {
		name = c.name + "." + name
	}
	c.name = name
	return &c
}

// ResetNamed implements hclog.Logger.
func (b *slogBridge) ResetNamed(name string) hclog.Logger {
	c := *b
	c.name = name
	return &c
}

// SetLevel implements hclog.Logger; the level is the slog handler's.
func (b *slogBridge) SetLevel(hclog.Level) {}

// GetLevel implements hclog.Logger: the lowest level the handler takes.
func (b *slogBridge) GetLevel() hclog.Level {
	for _, l := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn, hclog.Error} {
		if b.l.Enabled(context.Background(), slogLevel(l)) {
			return l
		}
	}
	return hclog.Off
}

// StandardLogger implements hclog.Logger.
func (b *slogBridge) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(b.StandardWriter(opts), "", 0)
}

// StandardWriter implements hclog.Logger.
func (b *slogBridge) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return bridgeWriter{b}
}

type bridgeWriter struct{ b *slogBridge }

// Write logs p as one info line.
func (w bridgeWriter) Write(p []byte) (int, error) {
	w.b.Info(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

package sdk

import (
	"io"
	"log/slog"
	"strings"
	"time"

	hclog "github.com/hashicorp/go-hclog"
)

// hclogTimeFormat is the timestamp layout go-plugin's host parses in a
// plugin's JSON log lines; any other layout turns the line into plain text.
const hclogTimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// NewLogger returns a logger that writes JSON lines in the form go-plugin's
// host side parses (@level, @message, @timestamp), so that the host logs
// them with their level and fields under the plugin's name. It writes to w,
// which must be stderr in a plugin: stdout is the handshake channel.
func NewLogger(w io.Writer, level slog.Leveler) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) > 0 {
				return a
			}
			switch a.Key {
			case slog.TimeKey:
				return slog.String("@timestamp", a.Value.Time().Format(hclogTimeFormat))
			case slog.LevelKey:
				l, _ := a.Value.Any().(slog.Level)
				return slog.String("@level", hclogLevel(l))
			case slog.MessageKey:
				return slog.String("@message", a.Value.String())
			}
			return a
		},
	}))
}

func hclogLevel(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "error"
	case l >= slog.LevelWarn:
		return "warn"
	case l >= slog.LevelInfo:
		return "info"
	case l >= slog.LevelDebug:
		return "debug"
	}
	return "trace"
}

// hclogLogger returns an hclog logger for go-plugin's own server-side
// messages, in the same JSON form, on w.
func hclogLogger(w io.Writer, name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:       name,
		Output:     w,
		JSONFormat: true,
		Level:      hclog.Info,
		TimeFn:     time.Now,
	})
}

// levelFromEnv parses the KVTIER_PLUGIN_LOG_LEVEL variable.
func levelFromEnv(s string) slog.Level {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "debug", "trace":
		return slog.LevelDebug
	case "warn", "warning":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

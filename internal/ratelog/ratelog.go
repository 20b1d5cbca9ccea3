// Package ratelog writes a log line per condition at most once per
// interval, counting what it held back, so a fault that repeats (a full
// slab, a dead plugin, a failing disk) degrades quietly instead of
// flooding the log, and the line that does get through says how many were
// suppressed since the last one.
//
// A condition is a key chosen by the caller ("slab exhausted", "put
// failed: disk 0"). The clock is injected so tests are deterministic; the
// package never decides anything a rank must agree on (it only logs and
// counts), so reading time here is allowed.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Log is a rate-limited logger. It is safe for concurrent use; the zero
// value is not usable, use New.
type Log struct {
	logger   *slog.Logger
	interval time.Duration
	now      func() time.Time

	mu   sync.Mutex
	keys map[string]*keyState
}

type keyState struct {
	last       time.Time
	total      uint64
	suppressed uint64
}

// Option configures a Log.
type Option func(*Log)

// WithClock replaces time.Now (for tests).
func WithClock(now func() time.Time) Option { return func(l *Log) { l.now = now } }

// New returns a Log that writes to logger (slog.Default() when nil) at
// most once per interval per key. An interval <= 0 logs every call.
func New(logger *slog.Logger, interval time.Duration, opts ...Option) *Log {
	if logger == nil {
		logger = slog.Default()
	}
	l := &Log{logger: logger, interval: interval, now: time.Now, keys: make(map[string]*keyState)}
	for _, o := range opts {
		o(l)
	}
	return l
}

// Allow counts one occurrence of key and reports whether a line may be
// written now, with the number of occurrences held back since the last
// line that was allowed. A caller that writes its own line uses this.
func (l *Log) Allow(key string) (ok bool, suppressed uint64) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	st, seen := l.keys[key]
	if !seen {
		st = &keyState{}
		l.keys[key] = st
	}
	st.total++
	if seen && l.interval > 0 && now.Sub(st.last) < l.interval {
		st.suppressed++
		return false, 0
	}
	suppressed = st.suppressed
	st.last, st.suppressed = now, 0
	return true, suppressed
}

// Log counts one occurrence of key and writes msg with args at level
// unless key was logged within the interval; a line that follows
// suppressed ones carries a "suppressed" attribute with their number. It
// reports whether it wrote.
func (l *Log) Log(level slog.Level, key, msg string, args ...any) bool {
	ok, n := l.Allow(key)
	if !ok {
		return false
	}
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	l.logger.Log(context.Background(), level, msg, args...)
	return true
}

// Warn is Log at warn level.
func (l *Log) Warn(key, msg string, args ...any) bool {
	return l.Log(slog.LevelWarn, key, msg, args...)
}

// Error is Log at error level.
func (l *Log) Error(key, msg string, args ...any) bool {
	return l.Log(slog.LevelError, key, msg, args...)
}

// Total returns how many occurrences of key were counted, logged or not.
func (l *Log) Total(key string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if st, ok := l.keys[key]; ok {
		return st.total
	}
	return 0
}

package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestLogRateLimitsPerKey(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	l := New(slog.New(slog.NewTextHandler(&buf, nil)), 10*time.Second, WithClock(func() time.Time { return now }))
	type step struct {
		advance time.Duration
		key     string
		wrote   bool
	}
	steps := []step{
		{0, "a", true},
		{time.Second, "a", false},
		{time.Second, "b", true}, // another key is independent
		{time.Second, "a", false},
		{8 * time.Second, "a", true}, // 10 s after the first line of a
		{0, "a", false},
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		if got := l.Warn(s.key, "cond", "i", i); got != s.wrote {
			t.Fatalf("step %d (key %s): wrote %v, want %v", i, s.key, got, s.wrote)
		}
	}
	if got := l.Total("a"); got != 5 {
		t.Fatalf("Total(a) = %d, want 5", got)
	}
	if got := l.Total("zzz"); got != 0 {
		t.Fatalf("Total(zzz) = %d, want 0", got)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[2], "suppressed=2") {
		t.Fatalf("third line %q lacks suppressed=2", lines[2])
	}
	if strings.Contains(lines[0], "suppressed") {
		t.Fatalf("first line %q has a suppressed count", lines[0])
	}
}

func TestZeroIntervalLogsEverything(t *testing.T) {
	var buf bytes.Buffer
	l := New(slog.New(slog.NewTextHandler(&buf, nil)), 0)
	for i := 0; i < 3; i++ {
		if !l.Error("k", "x") {
			t.Fatalf("call %d suppressed with a zero interval", i)
		}
	}
	if ok, n := l.Allow("k"); !ok || n != 0 {
		t.Fatalf("Allow = %v, %d; want true, 0", ok, n)
	}
}

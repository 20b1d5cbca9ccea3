package pluginhost

import (
	"github.com/kvtier/kvtier/internal/ratelog"

	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// supervisor restarts a plugin after it went down: exponential backoff
// between attempts, and a circuit breaker that stops trying for a cooldown
// after too many consecutive failures. go-plugin cannot restart a Client
// whose process exited, so every attempt launches a new one (start).
//
// A failure counts towards the breaker if a start attempt failed, or if the
// plugin went down within StableAfter of starting (a crash loop). A plugin
// that stayed up longer starts afresh.
type supervisor struct {
	name string
	opts Options
	m    *metrics
	rl   *ratelog.Log
	log  *slog.Logger
	// start launches and installs a new process; it returns an error if
	// the attempt failed (the proxy stays down).
	start func(ctx context.Context) error

	kick   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	failures int // consecutive
}

func newSupervisor(name string, opts Options, m *metrics, logger *slog.Logger, rl *ratelog.Log, start func(context.Context) error) *supervisor {
	ctx, cancel := context.WithCancel(context.Background())
	s := &supervisor{name: name, opts: opts, m: m, rl: rl, log: logger, start: start, kick: make(chan struct{}, 1), ctx: ctx, cancel: cancel}
	s.wg.Add(1)
	go s.loop()
	return s
}

// wentDown records that the process started at upSince went down and
// schedules a restart.
func (s *supervisor) wentDown(upSince time.Time) {
	s.mu.Lock()
	if sinceStart(upSince) >= s.opts.StableAfter {
		s.failures = 0
	}
	s.failures++
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// stop ends the restart loop and waits for an attempt in progress (which
// the cancellation abandons: launch kills a plugin mid-handshake).
func (s *supervisor) stop() {
	s.cancel()
	s.wg.Wait()
}

// stopWithin is stop waiting at most until ctx is done; it reports whether
// the loop ended. An attempt that outlives it cannot install its process:
// the owner is closed by then and start refuses.
func (s *supervisor) stopWithin(ctx context.Context) bool {
	s.cancel()
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

func (s *supervisor) loop() {
	defer s.wg.Done()
	for {
		select {
		case <-s.kick:
		case <-s.ctx.Done():
			return
		}
		for {
			s.mu.Lock()
			n := s.failures
			s.mu.Unlock()
			delay := s.opts.backoff(max(n-1, 0))
			breaker := n >= s.opts.BreakerFailures
			if breaker {
				delay = s.opts.BreakerCooldown
				s.m.breakerOpen.Set(1)
				s.rl.Error("breaker", "plugin restart circuit breaker open; waiting before one trial restart",
					"plugin", s.name, "consecutive_failures", n, "cooldown", delay)
			}
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-s.ctx.Done():
				t.Stop()
				return
			}
			err := s.start(s.ctx)
			if errors.Is(err, errAlreadyUp) {
				break
			}
			if err == nil {
				s.m.breakerOpen.Set(0)
				s.m.restarts.Inc()
				s.log.Info("plugin restarted", "plugin", s.name, "after_failures", n)
				break
			}
			if errors.Is(err, context.Canceled) && s.ctx.Err() != nil {
				return
			}
			s.m.failures.WithLabelValues(reasonStart).Inc()
			s.mu.Lock()
			s.failures++
			s.mu.Unlock()
			s.rl.Error("restart", "plugin restart failed; still down", "plugin", s.name, "error", errString(err), "attempt", n+1)
		}
	}
}

// errAlreadyUp is what start returns when a kick finds the plugin serving
// (the kick was about a process that has since been replaced).
var errAlreadyUp = errors.New("plugin already up")

package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/kvtier/kvtier/internal/ratelog"
)

// generation is one plugin process serving a Store or an Index, from its
// launch to its teardown. R is what the role keeps per process: its gRPC
// client and, for the store, the ack stream and the last stats seen.
type generation[R any] struct {
	id      int // 1, 2, ... in launch order within one Store or Index
	proc    *process
	impl    string // what the plugin calls itself in its open reply
	started time.Time
	rpc     R

	// onTeardown, if set, runs first in teardown (the store cancels its
	// ack stream there).
	onTeardown func()
	stopped    chan struct{} // closed when the generation is torn down
	stopOnce   sync.Once
	closing    bool // set under the owner's mu by Close: the end is expected
}

// teardown stops the generation's goroutines and ends its process group:
// gracefully, waiting at most grace for the plugin to exit, or with a kill
// at once if grace is 0 (for a plugin that is broken).
func (g *generation[R]) teardown(grace time.Duration) {
	g.stopOnce.Do(func() {
		close(g.stopped)
		if g.onTeardown != nil {
			g.onTeardown()
		}
		if grace <= 0 {
			g.proc.kill()
		} else {
			g.proc.stop(grace)
		}
	})
}

// lifecycle is the supervised life of a plugin process that Store and
// Index share: launch, handshake and open, serve, go down (crash, hang,
// malformed reply), be restarted by the supervisor, close. The role
// supplies what differs: how a launched process is opened, what else
// serves it, and what going down means for its pending work.
//
// Store and Index embed it, so mu also guards the role's own state.
type lifecycle[R any] struct {
	role      string // "store" or "index"
	service   string // the go-plugin dispense name
	errClosed error  // the role's ErrClosed sentinel
	downMsg   string // logged when the plugin goes down

	spec   PluginSpec
	opts   Options
	config []byte
	logger *slog.Logger
	m      *metrics
	rl     *ratelog.Log
	sup    *supervisor

	// whenDown runs under mu when generation g goes down; it settles the
	// role's pending work and returns extra attributes for the log line.
	// It may be nil.
	whenDown func(g *generation[R], reason string) []any

	mu     sync.Mutex
	gen    *generation[R] // the serving generation; nil while down
	genSeq int
	closed bool
}

// closedErr is the error of a call on a closed Store or Index.
func (l *lifecycle[R]) closedErr() error {
	return fmt.Errorf("plugin %s: %w", l.spec.Name, l.errClosed)
}

// start launches a plugin process, has open make it serve the role, and
// installs it as the serving generation; serve, if set, then starts the
// role's own goroutines for it. open gets the running process and returns
// the generation's role state; if it fails it must kill the process.
func (l *lifecycle[R]) start(ctx context.Context, open func(ctx context.Context, proc *process) (g *generation[R], err error), serve func(g *generation[R])) error {
	l.mu.Lock()
	switch {
	case l.closed:
		l.mu.Unlock()
		return l.closedErr()
	case l.gen != nil:
		l.mu.Unlock()
		return errAlreadyUp
	}
	l.mu.Unlock()
	proc, err := launch(ctx, l.spec, l.opts, l.service, l.logger)
	if err != nil {
		return err
	}
	g, err := open(ctx, proc)
	if err != nil {
		if ctx.Err() != nil {
			// The supervisor is stopping: say so, so it does not count a
			// failed restart.
			return fmt.Errorf("%w (start abandoned: %w)", err, context.Cause(ctx))
		}
		return err
	}
	g.proc, g.started, g.stopped = proc, time.Now(), make(chan struct{})
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		g.teardown(0)
		return l.closedErr()
	}
	l.genSeq++
	g.id = l.genSeq
	l.gen = g
	l.m.up.Set(1) // under mu, so a failure right after sets it back to 0
	l.mu.Unlock()
	if serve != nil {
		serve(g)
	}
	go l.watchExit(g)
	return nil
}

// watchExit marks the plugin down when the process exits on its own.
func (l *lifecycle[R]) watchExit(g *generation[R]) {
	select {
	case <-g.proc.exited.Done():
		l.fail(g, reasonCrash, errors.New("plugin process exited"))
	case <-g.stopped:
	}
}

// fail marks generation g down: its process group is killed, then the
// role settles its pending work and the supervisor restarts it. If g is no
// longer the serving generation (another caller is taking it down, or it
// was replaced) fail only waits for g's process group to be gone.
//
// Either way fail returns only once no process of g's group can run: a
// call that failed (timed out, most often) must not hand back a Get
// destination or a Put source that a slow plugin could still write or
// read after the host has reused it.
func (l *lifecycle[R]) fail(g *generation[R], reason string, cause error) {
	l.mu.Lock()
	if g.closing {
		l.mu.Unlock()
		return
	}
	if l.gen != g {
		l.mu.Unlock()
		g.proc.kill() // returns when the first kill of g has finished
		return
	}
	l.gen = nil
	// NB: count before the role settles its pending work (failed acks),
	// so that whoever sees that also sees the failure counted.
	l.m.up.Set(0)
	l.m.failures.WithLabelValues(reason).Inc()
	l.mu.Unlock()
	// NB: the group dies before a single miss or failed ack is handed out.
	g.proc.kill()
	var extra []any
	if l.whenDown != nil {
		l.mu.Lock()
		extra = l.whenDown(g, reason)
		l.mu.Unlock()
	}
	attrs := append([]any{"reason", reason, "error", errString(cause)}, extra...)
	attrs = append(attrs, "pid", g.proc.pid, "plugin_said", g.proc.notes.lastLines())
	l.rl.Error("down", l.downMsg, attrs...)
	go g.teardown(0)
	l.sup.wentDown(g.started)
}

// serving returns the serving generation, nil while down, or the role's
// ErrClosed.
func (l *lifecycle[R]) serving() (*generation[R], error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, l.closedErr()
	}
	return l.gen, nil
}

// close marks the Store or Index closed, stops the restarter, lets
// closeGen close the serving generation's role (its error, if any, makes
// the teardown a kill), ends the process group and runs whenClosed under
// mu. All of it shares one CloseTimeout: a restart in progress is
// abandoned, and a plugin still running at the deadline is killed. A
// second close returns nil.
func (l *lifecycle[R]) close(closeGen func(ctx context.Context, g *generation[R]) error, whenClosed func()) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	g := l.gen
	if g != nil {
		g.closing = true
	}
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), l.opts.CloseTimeout)
	defer cancel()
	if !l.sup.stopWithin(ctx) {
		l.logger.Error("plugin restart still running at the close deadline; left to finish on its own", "close_timeout", l.opts.CloseTimeout)
	}
	var err error
	if g != nil {
		err = closeGen(ctx, g)
		grace := time.Duration(0) // a plugin that failed to close is killed
		if err == nil {
			dl, _ := ctx.Deadline()
			grace = time.Until(dl)
		}
		g.teardown(grace)
	}
	l.mu.Lock()
	if whenClosed != nil {
		whenClosed()
	}
	l.gen = nil
	l.mu.Unlock()
	l.m.up.Set(0)
	if l.m.unregister != nil {
		l.m.unregister()
	}
	return err
}

// Implementation returns what the serving plugin calls itself in its open
// reply (name and version) and the negotiated protocol version; "" and 0
// while it is down.
func (l *lifecycle[R]) Implementation() (impl string, protocol int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gen == nil {
		return "", 0
	}
	return l.gen.impl, l.gen.proc.version
}

// PID returns the process id of the serving plugin process, 0 while the
// plugin is down. It is for operators and benchmarks (CPU accounting); the
// host never signals it.
func (l *lifecycle[R]) PID() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gen == nil {
		return 0
	}
	return l.gen.proc.pid
}

package pluginhost

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/internal/ratelog"
	"github.com/kvtier/kvtier/plugins"
	"github.com/kvtier/kvtier/plugins/internal/wire"
	"github.com/kvtier/kvtier/plugins/proto/indexv1"
)

// Index is an indexes.Index served by a supervised plugin process.
//
// While the plugin is down, Get reports every key absent (a miss) and
// every other method fails with an error wrapping ErrDown.
type Index struct {
	lifecycle[indexv1.IndexClient]

	env indexes.Env
}

var _ indexes.Index = (*Index)(nil)

// indexGen is one plugin process serving the index.
type indexGen = generation[indexv1.IndexClient]

// OpenIndex starts the plugin binary of spec and opens its Index v1. It
// refuses a binary whose SHA-256 is not spec.SHA256, a plugin with no common
// protocol version, and one that fails the handshake.
func OpenIndex(ctx context.Context, env indexes.Env, spec PluginSpec) (*Index, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if env.Logger == nil {
		return nil, fmt.Errorf("plugin %s: index env: logger is nil", spec.Name)
	}
	config, err := spec.configJSON()
	if err != nil {
		return nil, err
	}
	opts := spec.Options.withDefaults()
	logger := env.Logger.With("plugin", spec.Name)
	m, err := newMetrics(env.Registerer, spec.Name, "index")
	if err != nil {
		return nil, err
	}
	x := &Index{
		lifecycle: lifecycle[indexv1.IndexClient]{
			role: "index", service: plugins.IndexService, errClosed: indexes.ErrClosed,
			downMsg: "index plugin down; lookups miss and writes fail until it restarts",
			spec:    spec, opts: opts, config: config, logger: logger, m: m,
			rl: ratelog.New(logger, opts.LogInterval),
		},
		env: env,
	}
	// The supervisor exists before the first process, which may die at
	// once; it acts only when a process goes down.
	x.sup = newSupervisor(spec.Name, opts, m, logger, x.rl, x.startGen)
	if err := x.startGen(ctx); err != nil {
		x.sup.stop()
		if m.unregister != nil {
			m.unregister()
		}
		return nil, err
	}
	return x, nil
}

// startGen launches a plugin process, opens the index in it and installs
// it as the serving generation.
func (x *Index) startGen(ctx context.Context) error {
	return x.start(ctx, func(ctx context.Context, proc *process) (*indexGen, error) {
		client := indexv1.NewIndexClient(proc.conn)
		octx, cancel := context.WithTimeout(ctx, x.opts.OpenTimeout)
		defer cancel()
		reply, err := client.Open(octx, &indexv1.OpenRequest{Name: x.spec.Name, Dir: x.env.Dir, ConfigJson: x.config})
		if err != nil {
			proc.kill()
			if status.Code(err) == codes.Unimplemented {
				return nil, fmt.Errorf("plugin %s (%s): it does not serve kvtier.index.v1 (is it a store plugin?): %w", x.spec.Name, x.spec.Path, ErrHandshake)
			}
			if err := x.indexError("open", err); err != nil && !errors.Is(err, ErrDown) {
				return nil, fmt.Errorf("plugin %s (%s): %w%s", x.spec.Name, x.spec.Path, err, saidSuffix(proc.notes))
			}
			return nil, fmt.Errorf("plugin %s (%s): open index: %w%s", x.spec.Name, x.spec.Path, wire.CallError(err), saidSuffix(proc.notes))
		}
		return &indexGen{impl: reply.GetImplementation(), rpc: client}, nil
	}, func(g *indexGen) {
		x.logger.Info("index plugin serving", "impl", g.impl, "protocol", g.proc.version, "pid", g.proc.pid)
	})
}

// fail marks generation g down: the process is killed and the supervisor
// restarts it. It is a no-op if g is no longer the serving generation.
func (x *Index) fail(g *indexGen, reason string, cause error) { x.lifecycle.fail(g, reason, cause) }

// indexError maps a plugin's error status to the Index v1 sentinels; it
// returns an error wrapping ErrDown for failures that mean the plugin is
// broken (the caller marks it down).
func (x *Index) indexError(method string, err error) error {
	cause := wire.CallError(err)
	switch wire.Classify(err) {
	case wire.CallFull:
		return fmt.Errorf("plugin %s: index %s: %w: %w", x.spec.Name, method, cause, indexes.ErrFull)
	case wire.CallInUse:
		return fmt.Errorf("plugin %s: index %s: %w: %w", x.spec.Name, method, cause, indexes.ErrInUse)
	case wire.CallCorrupt:
		return fmt.Errorf("plugin %s: index %s: %w: %w", x.spec.Name, method, cause, indexes.ErrCorrupt)
	case wire.CallInvalid:
		return fmt.Errorf("plugin %s: index %s: plugin refused the request: %w: %w", x.spec.Name, method, cause, indexes.ErrInvalid)
	}
	return fmt.Errorf("plugin %s: index %s: %w: %w", x.spec.Name, method, cause, ErrDown)
}

// call runs one call on the serving plugin. It returns degraded = true,
// with an error wrapping ErrDown, when the plugin is down or failed during
// the call (and marks it down).
func (x *Index) call(ctx context.Context, method string, fn func(ctx context.Context, c indexv1.IndexClient) error) (degraded bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("plugin %s: index %s: %w", x.spec.Name, method, err)
	}
	x.mu.Lock()
	closed, g := x.closed, x.gen
	x.mu.Unlock()
	if closed {
		return false, fmt.Errorf("plugin %s: index %s: %w", x.spec.Name, method, indexes.ErrClosed)
	}
	if g == nil {
		x.rl.Warn("degraded-"+method, "index plugin down: "+method+" degraded")
		return true, fmt.Errorf("plugin %s: index %s: %w", x.spec.Name, method, ErrDown)
	}
	cctx, cancel := callCtx(ctx, x.opts)
	defer cancel()
	start := time.Now()
	err = fn(cctx, g.rpc)
	x.m.observe(method, start)
	if err == nil {
		return false, nil
	}
	if ctx.Err() != nil {
		return false, fmt.Errorf("plugin %s: index %s: %w", x.spec.Name, method, ctx.Err())
	}
	if errors.Is(err, wire.ErrMalformed) {
		x.fail(g, reasonMalformed, err)
		return true, fmt.Errorf("plugin %s: index %s: %w: %w", x.spec.Name, method, err, ErrDown)
	}
	if wire.Classify(err) == wire.CallTimeout {
		x.fail(g, reasonTimeout, fmt.Errorf("%s past its %v deadline", method, x.opts.CallTimeout))
		return true, fmt.Errorf("plugin %s: index %s: hung past %v: %w", x.spec.Name, method, x.opts.CallTimeout, ErrDown)
	}
	mapped := x.indexError(method, err)
	if errors.Is(mapped, ErrDown) {
		x.fail(g, reasonCrash, err)
		return true, mapped
	}
	return false, mapped
}

func (x *Index) degradedWrite(method string, n int) {
	x.m.degraded.WithLabelValues(method).Add(float64(n))
}

// Put writes entries through the plugin.
func (x *Index) Put(ctx context.Context, entries []indexes.Entry) error {
	degraded, err := x.call(ctx, "put", func(ctx context.Context, c indexv1.IndexClient) error {
		_, err := c.Put(ctx, &indexv1.PutRequest{Entries: wire.Entries(entries)})
		return err
	})
	if degraded {
		x.degradedWrite("index_put", len(entries))
	}
	return err
}

// Get looks keys up through the plugin; while it is down every key is
// reported absent and the call succeeds.
func (x *Index) Get(ctx context.Context, keys []indexes.Key, dst []indexes.Record, found []bool) error {
	if len(dst) != len(keys) || len(found) != len(keys) {
		return fmt.Errorf("plugin %s: index get: %d records and %d flags for %d keys: %w", x.spec.Name, len(dst), len(found), len(keys), indexes.ErrInvalid)
	}
	degraded, err := x.call(ctx, "get", func(ctx context.Context, c indexv1.IndexClient) error {
		reply, err := c.Get(ctx, &indexv1.GetRequest{Keys: wire.IndexKeys(keys)})
		if err != nil {
			return err
		}
		rs := reply.GetResults()
		if len(rs) != len(keys) {
			return fmt.Errorf("get reply has %d results for %d keys: %w", len(rs), len(keys), wire.ErrMalformed)
		}
		recs := make([]indexes.Record, len(rs))
		for i, r := range rs {
			if !r.GetFound() {
				continue
			}
			if recs[i], err = wire.FromRecord(r.GetRecord()); err != nil {
				return fmt.Errorf("get reply for %s: %w", keys[i], err)
			}
		}
		for i, r := range rs {
			found[i] = r.GetFound()
			dst[i] = recs[i]
		}
		return nil
	})
	if degraded {
		clear(found)
		x.m.degraded.WithLabelValues("index_get").Add(float64(len(keys)))
		return nil
	}
	return err
}

// Delete removes keys through the plugin.
func (x *Index) Delete(ctx context.Context, keys []indexes.Key) error {
	degraded, err := x.call(ctx, "delete", func(ctx context.Context, c indexv1.IndexClient) error {
		_, err := c.Delete(ctx, &indexv1.DeleteRequest{Keys: wire.IndexKeys(keys)})
		return err
	})
	if degraded {
		x.degradedWrite("index_delete", len(keys))
	}
	return err
}

// DeleteIf removes keys whose records still match, through the plugin.
func (x *Index) DeleteIf(ctx context.Context, entries []indexes.Entry, deleted []bool) error {
	if len(deleted) != len(entries) {
		return fmt.Errorf("plugin %s: index delete-if: %d flags for %d entries: %w", x.spec.Name, len(deleted), len(entries), indexes.ErrInvalid)
	}
	degraded, err := x.call(ctx, "delete_if", func(ctx context.Context, c indexv1.IndexClient) error {
		reply, err := c.DeleteIf(ctx, &indexv1.DeleteIfRequest{Entries: wire.Entries(entries)})
		if err != nil {
			return err
		}
		if len(reply.GetDeleted()) != len(entries) {
			return fmt.Errorf("delete-if reply has %d flags for %d entries: %w", len(reply.GetDeleted()), len(entries), wire.ErrMalformed)
		}
		copy(deleted, reply.GetDeleted())
		return nil
	})
	if degraded {
		clear(deleted)
		x.degradedWrite("index_delete_if", len(entries))
	}
	return err
}

// Touch sets last access times through the plugin.
func (x *Index) Touch(ctx context.Context, keys []indexes.Key, at uint64) error {
	degraded, err := x.call(ctx, "touch", func(ctx context.Context, c indexv1.IndexClient) error {
		_, err := c.Touch(ctx, &indexv1.TouchRequest{Keys: wire.IndexKeys(keys), At: at})
		return err
	})
	if degraded {
		x.degradedWrite("index_touch", len(keys))
	}
	return err
}

// Iterate streams the plugin's entries to fn in key order. The call
// deadline applies to each batch of the stream, not to the whole walk.
func (x *Index) Iterate(ctx context.Context, fn func(indexes.Entry) error) error {
	var stop error
	_, err := x.call(ctx, "iterate", func(cctx context.Context, c indexv1.IndexClient) error {
		// The whole walk may take longer than one call's deadline: run the
		// stream under the caller's context and watch each receive.
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := c.Iterate(sctx, &indexv1.IterateRequest{})
		if err != nil {
			return err
		}
		var prev []byte
		var kb [indexes.KeySize]byte
		for {
			msg, err := recvWithin(sctx, cancel, x.opts.CallTimeout, stream.Recv)
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			es, err := wire.FromEntries(msg.GetEntries())
			if err != nil {
				return fmt.Errorf("iterate batch: %w", err)
			}
			for _, e := range es {
				indexes.EncodeKey(&kb, e.Key)
				if prev != nil && bytes.Compare(prev, kb[:]) >= 0 {
					return fmt.Errorf("iterate: key %s out of order: %w", e.Key, wire.ErrMalformed)
				}
				prev = append(prev[:0], kb[:]...)
				if err := fn(e); err != nil {
					stop = err
					return nil
				}
			}
		}
	})
	if stop != nil {
		return stop
	}
	return err
}

// recvWithin receives one stream message, cancelling the stream and
// reporting DeadlineExceeded if none arrives within d.
func recvWithin[T any](ctx context.Context, cancel context.CancelFunc, d time.Duration, recv func() (T, error)) (T, error) {
	t := time.AfterFunc(d, cancel)
	msg, err := recv()
	if !t.Stop() && ctx.Err() != nil && err != nil {
		var zero T
		return zero, status.Error(codes.DeadlineExceeded, fmt.Sprintf("no stream message within %v", d))
	}
	return msg, err
}

// Stats returns the plugin's index stats.
func (x *Index) Stats(ctx context.Context) (indexes.Stats, error) {
	var st indexes.Stats
	_, err := x.call(ctx, "stats", func(ctx context.Context, c indexv1.IndexClient) error {
		r, err := c.Stats(ctx, &indexv1.StatsRequest{})
		if err != nil {
			return err
		}
		if r.GetEntries() < 0 || r.GetBytes() < 0 || r.GetCapacityBytes() < 0 {
			return fmt.Errorf("stats %v: negative counter: %w", r, wire.ErrMalformed)
		}
		st = indexes.Stats{Entries: r.GetEntries(), Bytes: r.GetBytes(), CapacityBytes: r.GetCapacityBytes()}
		return nil
	})
	return st, err
}

// Close closes the plugin's index, stops the restarter and ends the
// process.
func (x *Index) Close() error {
	return x.close(func(ctx context.Context, g *indexGen) error {
		if _, cerr := g.rpc.Close(ctx, &indexv1.CloseRequest{}); cerr != nil {
			return fmt.Errorf("plugin %s: close index: %w", x.spec.Name, wire.CallError(cerr))
		}
		return nil
	}, nil)
}

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/kvtier/kvtier/loadgen"
	"github.com/kvtier/kvtier/workload"
)

// benchServeShadow alternates rounds of a `kvtier serve` subprocess with
// --shadow shadow and without, each a fresh serve over the same workload,
// and reports serve's CPU time per step of each (the process's user and
// system time over the loadgen run, from /proc) and their ratio. The
// subprocess keeps loadgen's CPU out of serve's. The shadow rounds wait
// until the shadows have replayed every lookup before reading the CPU, so
// their whole cost is counted.
func benchServeShadow(ctx context.Context, o serveRound, l3 string, shadow []string, rounds int, stdout io.Writer, asJSON bool) error {
	// NB: serve runs from this binary; a test binary runs as kvtier with
	// asMainEnv set (TestMain).
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench serve: %w", err)
	}
	var with, without, busyPerStep []float64
	var steps int64
	for i := range 2 * rounds {
		var sh []string
		if i%2 == 0 {
			sh = shadow
		}
		cpu, busy, res, err := o.runChild(ctx, exe, l3, sh)
		if err != nil {
			return fmt.Errorf("round %d (shadows %v): %w", i/2+1, sh, err)
		}
		perStep := cpu.Seconds() * 1e6 / float64(res.Steps)
		if sh != nil {
			with = append(with, perStep)
			busyPerStep = append(busyPerStep, busy.Seconds()*1e6/float64(res.Steps))
		} else {
			without = append(without, perStep)
		}
		steps = res.Steps
	}
	a, b := median(with), median(without)
	what := copiesRun
	if !o.copies {
		what = copiesNotRun
	}
	note := fmt.Sprintf("%d alternating rounds each, a fresh serve subprocess a round; serve's CPU (user+system, /proc) over the run / steps; shadows %s at every live tier's capacity (plus the live policy's own shadow); L3 %s; %s; %s; %d sessions, %d new requests a step, %d requests, %d steps a round; %s",
		rounds, strings.Join(shadow, ","), l3, what, o.geometry(), o.sessions, o.perStep, o.requests, steps, loadNote())
	rows := []benchreport.Result{
		{Bench: "serve/cpu_per_step_shadow", Value: a, Unit: "us", Note: fmt.Sprintf("--shadow %s, rounds %v", strings.Join(shadow, ","), roundUs(with))},
		{Bench: "serve/cpu_per_step_noshadow", Value: b, Unit: "us", Note: fmt.Sprintf("no shadows, rounds %v", roundUs(without))},
	}
	r := benchreport.Result{Bench: "serve/shadow_cpu_ratio", Value: a, Unit: "us", Limit: b, LimitName: "serve CPU per step without shadows, same run", Target: 1 / 1.1, Note: note}
	if a > 0 {
		r.Ratio = b / a
	}
	rows = append(rows, r)
	// The shadows' worker time per step (wall time of a CPU-bound
	// goroutine: at least its CPU time) over serve's CPU per step without
	// them: the added share, less noisy than the difference of two runs.
	c := median(busyPerStep)
	share := benchreport.Result{Bench: "serve/shadow_busy_share", Value: c, Unit: "us", Limit: b, LimitName: "serve CPU per step without shadows, same run", Note: fmt.Sprintf("the shadows' worker time a step, rounds %v; ratio = added share of serve's CPU (target at most 0.10)", roundUs(busyPerStep))}
	if b > 0 {
		share.Ratio = c / b
	}
	rows = append(rows, share)
	return benchreport.Write(stdout, rows, asJSON)
}

// asMainEnv makes a `go test` binary of this package run as kvtier (see
// TestMain), so the bench can start serve from it.
const asMainEnv = "KVTIER_TEST_AS_MAIN"

// runChild runs one round against a serve subprocess and returns its CPU
// time over the loadgen run.
func (o serveRound) runChild(ctx context.Context, exe, l3 string, shadow []string) (cpuTime, shadowTime time.Duration, _ loadgen.Result, _ error) {
	fail := func(err error) (time.Duration, time.Duration, loadgen.Result, error) {
		return 0, 0, loadgen.Result{}, err
	}
	data, err := os.MkdirTemp(o.dir, "kvtier-bench-serve-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(data)
	sd, err := os.MkdirTemp("", "kbs")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(sd)
	yaml, err := o.stackYAML(l3)
	if err != nil {
		return fail(err)
	}
	cfg := filepath.Join(data, "stack.yaml")
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		return fail(err)
	}
	sock := filepath.Join(sd, "s.sock")
	metricsAddr, err := freeLoopbackAddr()
	if err != nil {
		return fail(err)
	}
	args := []string{"serve", "--config", cfg, "--data-dir", filepath.Join(data, "d"), "--socket", sock, "--ranks", fmt.Sprint(o.sessions),
		"--doors", "engine", "--metrics", metricsAddr, "--log-level", "warn"}
	if len(shadow) > 0 {
		args = append(args, "--shadow", strings.Join(shadow, ","))
	}
	if !o.bgNice {
		args = append(args, "--background-nice=false")
	}
	if o.machinePerRank {
		args = append(args, "--machine-per-rank")
	}
	if o.ownerLanes {
		args = append(args, "--owner-lanes")
	}
	if o.traceFile != "" || o.cpuProfile != "" {
		n := childTraces.Add(1)
		if o.traceFile != "" {
			args = append(args, "--trace", fmt.Sprintf("%s.serve.%d", o.traceFile, n))
		}
		if o.cpuProfile != "" {
			args = append(args, "--cpuprofile", fmt.Sprintf("%s.serve.%d", o.cpuProfile, n))
		}
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	stderr := &limitedWriter{n: 64 << 10}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	// NB: closed (not sent on) when serve exits, so that every waiter
	// sees it: a serve that exits before it listens (a flag it refuses)
	// is seen by waitSocket and then by stop, which waited forever for a
	// value waitSocket had taken.
	exited := make(chan struct{})
	var exitErr error
	go func() { exitErr = cmd.Wait(); close(exited) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			return exitErr
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("serve did not stop within 30 s of SIGTERM")
		}
	}
	defer stop()
	if err := waitSocket(ctx, sock, exited, func() error { return exitErr }, 60*time.Second); err != nil {
		return fail(fmt.Errorf("serve: %w\n%s", err, stderr.String()))
	}
	proc, err := procfs.NewProc(cmd.Process.Pid)
	if err != nil {
		return fail(err)
	}
	cpu := func() (time.Duration, error) {
		st, err := proc.Stat()
		if err != nil {
			return 0, err
		}
		return time.Duration(st.CPUTime() * float64(time.Second)), nil
	}
	var reqs []workload.Request
	if o.pings == 0 {
		if reqs, err = o.workload(); err != nil {
			return fail(err)
		}
	}
	before, err := cpu()
	if err != nil {
		return fail(err)
	}
	var res loadgen.Result
	if o.pings > 0 {
		n, err := pingCalls(ctx, sock, o.sessions, o.pings)
		if err != nil {
			return fail(err)
		}
		res.Steps = int64(n)
	} else {
		if res, err = loadgen.Run(ctx, o.loadgenConfig(sock, reqs)); err != nil {
			return fail(fmt.Errorf("loadgen: %w", err))
		}
		if res, err = checked(res); err != nil {
			return fail(err)
		}
	}
	if len(shadow) > 0 {
		// NB: the shadows run behind the steps; wait until their worker
		// is idle (its CPU time stops moving) so all of it is counted.
		prev := time.Duration(-1)
		for range 200 {
			c, err := cpu()
			if err != nil {
				return fail(err)
			}
			if c == prev {
				break
			}
			prev = c
			time.Sleep(50 * time.Millisecond)
		}
	}
	after, err := cpu()
	if err != nil {
		return fail(err)
	}
	var busy time.Duration
	if len(shadow) > 0 {
		if busy, err = shadowBusy(ctx, metricsAddr); err != nil {
			return fail(err)
		}
	}
	if err := stop(); err != nil {
		return fail(fmt.Errorf("serve: %w\n%s", err, stderr.String()))
	}
	if res.Steps == 0 {
		return fail(fmt.Errorf("loadgen ran no steps"))
	}
	return after - before, busy, res, nil
}

// pingCalls makes empty Ping calls to serve's socket sock from conns
// connections in lockstep, as the sessions of an engine step: rounds
// times, every connection one call, and the next round when all are
// answered. It returns the calls made.
func pingCalls(ctx context.Context, sock string, conns, rounds int) (int, error) {
	cls := make([]pb.EngineClient, conns)
	for i := range cls {
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return 0, fmt.Errorf("ping %s: %w", sock, err)
		}
		defer conn.Close()
		cls[i] = pb.NewEngineClient(conn)
	}
	errs := make([]error, conns)
	for r := range rounds {
		var wg sync.WaitGroup
		for i, cl := range cls {
			wg.Go(func() {
				if _, err := cl.Ping(ctx, &pb.PingRequest{}); err != nil {
					errs[i] = fmt.Errorf("ping round %d of %d, connection %d: %w", r+1, rounds, i, err)
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return 0, err
		}
	}
	return conns * rounds, nil
}

// freeLoopbackAddr returns a loopback TCP address no one listens on now.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// shadowBusy scrapes kvtier_shadow_busy_seconds_total from serve's
// /metrics at addr.
func shadowBusy(ctx context.Context, addr string) (time.Duration, error) {
	body, err := scrapeOnce(ctx, &http.Client{Timeout: 10 * time.Second}, "http://"+addr+"/metrics")
	if err != nil {
		return 0, fmt.Errorf("scrape serve's metrics: %w", err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "kvtier_shadow_busy_seconds_total "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0, fmt.Errorf("kvtier_shadow_busy_seconds_total %q: %w", v, err)
			}
			return time.Duration(f * float64(time.Second)), nil
		}
	}
	return 0, fmt.Errorf("serve's metrics have no kvtier_shadow_busy_seconds_total")
}

// waitSocket waits until a unix socket at path accepts a connection.
func waitSocket(ctx context.Context, path string, exited <-chan struct{}, exitErr func() error, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("unix", path); err == nil {
			return c.Close()
		}
		select {
		case <-exited:
			return fmt.Errorf("exited before listening: %v", exitErr())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("no listener on %s within %s", path, limit)
}

// limitedWriter keeps the first n bytes written to it; safe for a
// writer goroutine and a reader.
type limitedWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
	n  int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n > 0 {
		k := min(len(p), l.n)
		l.n -= k
		l.b.Write(p[:k])
	}
	return len(p), nil
}

func (l *limitedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// childTraces numbers the serve subprocesses' trace and profile files of
// one bench.
var childTraces atomic.Int64

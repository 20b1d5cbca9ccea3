package serve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/pagehash"
)

// syncBuffer is a bytes.Buffer a process writes to while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	os.Stderr.Write(p)
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// tcpRank is one `kvtier serve --group tcp` process of a test.
type tcpRank struct {
	cmd  *exec.Cmd
	sock string
	out  *syncBuffer
	done chan error
}

// startTCPGroup starts size serve processes, one rank each, over one data
// dir, with rank 0 the hub at hub, as a context-parallel group with owner
// lanes over one shared slab and one shared index (config); it waits for
// every socket.
func startTCPGroup(t *testing.T, bin, dir, sd, hub, config string, size int) []*tcpRank {
	return startTCPNodes(t, bin, dir, sd, hub, config, size, 1)
}

// startTCPNodes starts size/per serve processes (nodes) of per ranks each
// (one Machine a process), as startTCPGroup does.
func startTCPNodes(t *testing.T, bin, dir, sd, hub, config string, size, per int) []*tcpRank {
	t.Helper()
	rs := make([]*tcpRank, size/per)
	for i := range rs {
		r := &tcpRank{sock: filepath.Join(sd, fmt.Sprintf("r%d.sock", i)), out: &syncBuffer{}, done: make(chan error, 1)}
		os.Remove(r.sock)
		r.cmd = exec.Command(bin, "serve", "--data-dir", dir, "--config", config, "--owner-lanes", "--socket", r.sock, "--log-level", "warn", "--ranks", fmt.Sprint(per),
			"--group", "tcp", "--group-rank", fmt.Sprint(i*per), "--group-size", fmt.Sprint(size), "--group-hub", hub, "--group-timeout", "2s")
		r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
		if err := r.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { r.done <- r.cmd.Wait() }()
		t.Cleanup(func() { _ = r.cmd.Process.Kill(); <-r.done; r.done <- nil })
		rs[i] = r
	}
	for i, r := range rs {
		for n := 0; ; n++ {
			if c, err := net.Dial("unix", r.sock); err == nil {
				c.Close()
				break
			}
			if n > 1000 {
				t.Fatalf("rank %d did not listen within 10 s:\n%s", i, r.out.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return rs
}

// tcpSetup builds kvtier and returns it, a data dir, a socket dir
// (removed at the test's end), a free loopback hub address and the
// embedded shared stack written as a config file.
func tcpSetup(t *testing.T) (bin, dir, sd, hub, config string) {
	t.Helper()
	bin, dir = buildKvtier(t), t.TempDir()
	sd, err := os.MkdirTemp("", "kvt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sd) })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hub = l.Addr().String()
	l.Close()
	config = filepath.Join(sd, "shared.yaml")
	if err := os.WriteFile(config, []byte(SharedYAML()), 0o600); err != nil {
		t.Fatal(err)
	}
	return bin, dir, sd, hub, config
}

// equalDigests runs 70 idle steps on every rank (past a digest tick) and
// fails unless every rank reports rank 0's digest at rank 0's tick; it
// returns the digest ticks seen.
func equalDigests(t *testing.T, ctx context.Context, es []*testEngine) int {
	t.Helper()
	digests := 0
	for range 70 {
		outs := stepAll(t, ctx, es, func() *pb.StepRequest { return &pb.StepRequest{} }, nil)
		if len(outs[0].Digest) == 0 {
			continue
		}
		for i, out := range outs[1:] {
			if !bytes.Equal(out.Digest, outs[0].Digest) || out.Tick != outs[0].Tick {
				t.Fatalf("tick %d: rank %d digest %x, rank 0 %x (tick %d)", outs[0].Tick, i+1, out.Digest, outs[0].Digest, out.Tick)
			}
		}
		digests++
	}
	return digests
}

// TestServeTCPGroup: four `kvtier serve` processes, one rank each, form
// the rank group over TCP on loopback. An engine of four ranks caches and
// hits with every byte right and equal digests on every rank. SIGKILL one
// rank's process: within the group's deadline the others refuse the step
// naming the rank that went away, and exit with status 1 saying why. A
// restart of all four (cold start load) finds the L3 pages again.
func TestServeTCPGroup(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs four kvtier serve processes (-short)")
	}
	const size = 4
	ctx := context.Background()
	bin, dir, sd, hub, config := tcpSetup(t)
	rs := startTCPGroup(t, bin, dir, sd, hub, config, size)
	dial := func() []*testEngine {
		es := make([]*testEngine, size)
		for i, r := range rs {
			es[i] = dialEngine(t, r.sock, uint32(i), size)
			if err := es[i].register(ctx); err != nil {
				t.Fatalf("rank %d: %v", i, err)
			}
			if es[i].reg.GroupTransport != GroupTCP || es[i].reg.OwnerLanes != size {
				t.Fatalf("rank %d: group transport %q, owner lanes %d, want %q and %d", i, es[i].reg.GroupTransport, es[i].reg.OwnerLanes, GroupTCP, size)
			}
			if i > 0 && es[i].reg.Slab.Files[0].Path != es[0].reg.Slab.Files[0].Path {
				t.Fatalf("rank %d maps slab %s, rank 0 %s: want one shared slab", i, es[i].reg.Slab.Files[0].Path, es[0].reg.Slab.Files[0].Path)
			}
		}
		return es
	}
	es := dial()
	keys := make([][]pagehash.Hash, 24)
	for i := range keys {
		keys[i] = chain(fmt.Sprintf("tcp-%d", i%8), 8, 12, fmt.Sprintf("t%d", i))
	}
	driveKeys(t, ctx, es, "tcp-a", keys)
	hit, _ := driveKeys(t, ctx, es, "tcp-b", keys)
	// Idle steps up to a digest tick: every rank reports the same digest.
	digests := equalDigests(t, ctx, es)
	wrong, verified := 0, 0
	for _, e := range es {
		wrong, verified = wrong+e.wrong, verified+e.verified
	}
	t.Logf("%d hit pages on the second pass, %d verified, %d digest ticks equal on %d ranks", hit, verified, digests, size)
	if hit == 0 || wrong != 0 || digests == 0 {
		t.Fatalf("%d hit pages, %d wrong, %d digest ticks", hit, wrong, digests)
	}
	// One index for the group; each rank's L3 slab files in one directory.
	if _, err := os.Stat(filepath.Join(dir, "index", "data.mdb")); err != nil {
		t.Fatalf("the shared index: %v", err)
	}
	for i := range size {
		if m, _ := filepath.Glob(filepath.Join(dir, "l3", fmt.Sprintf("kvtier-l3-serve-r%d-k*.slab", i))); len(m) == 0 {
			t.Fatalf("no L3 slab file of rank %d in %s", i, filepath.Join(dir, "l3"))
		}
	}
	// Let the L3 writes land, then kill rank 2.
	for range 20 {
		stepAll(t, ctx, es, func() *pb.StepRequest { return &pb.StepRequest{} }, nil)
		time.Sleep(10 * time.Millisecond)
	}
	const victim = 2
	if err := rs[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-rs[victim].done
	rs[victim].done <- nil
	t0 := time.Now()
	var wg sync.WaitGroup
	for i, e := range es {
		if i == victim {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := e.run(ctx, &pb.StepRequest{}, nil)
			if err != nil {
				return // the process already exited: also a refusal
			}
			if len(out.Errors) == 0 || out.Errors[0].Code != pb.ErrorCode_ERROR_CODE_UNAVAILABLE {
				t.Errorf("rank %d: a step with rank %d dead: errors %v, want UNAVAILABLE", i, victim, out.Errors)
			}
		}()
	}
	wg.Wait()
	for i, r := range rs {
		if i == victim {
			continue
		}
		select {
		case err := <-r.done:
			r.done <- err
			var ee *exec.ExitError
			if err == nil || !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("rank %d exited with %v, want status 1", i, err)
			}
			if out := r.out.String(); !strings.Contains(out, "rank group") && !strings.Contains(out, fmt.Sprintf("rank %d", victim)) {
				t.Fatalf("rank %d's exit does not say the group stopped:\n%s", i, out)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("rank %d still runs 15 s after rank %d died:\n%s", i, victim, r.out.String())
		}
	}
	t.Logf("the surviving ranks stopped %v after rank %d was killed", time.Since(t0).Round(time.Millisecond), victim)
	for _, e := range es {
		e.close()
	}

	// Restart all four: the L3 pages are found again, every byte right.
	rs = startTCPGroup(t, bin, dir, sd, hub, config, size)
	es = dial()
	_, l3 := driveKeys(t, ctx, es, "tcp-c", keys)
	wrong = 0
	for _, e := range es {
		wrong += e.wrong
	}
	if l3 == 0 || wrong != 0 {
		t.Fatalf("after the restart: %d L3 hit pages, %d wrong", l3, wrong)
	}
	t.Logf("after restarting all %d ranks: %d L3 hit pages on rank 0", size, l3)
	// SIGTERM drains every rank to a clean exit (an engine's disconnect
	// first would end them with status 1: a session's end stops the group).
	for _, r := range rs {
		if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range rs {
		select {
		case err := <-r.done:
			r.done <- err
			if err != nil {
				t.Fatalf("rank %d after SIGTERM: %v", i, err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("rank %d did not exit within 20 s of SIGTERM", i)
		}
	}
	for _, e := range es {
		e.close()
	}
}

// TestServeTCPNodes: two `kvtier serve` processes of two ranks each (a
// node each, one Machine a process) form the group over TCP, one member
// a process. An engine of four ranks caches and hits, every byte right,
// and every rank of both nodes reports the same digest at the same tick.
// SIGKILL of one node stops the other, naming the group.
func TestServeTCPNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two kvtier serve processes (-short)")
	}
	const size, per = 4, 2
	ctx := context.Background()
	bin, dir, sd, hub, config := tcpSetup(t)
	rs := startTCPNodes(t, bin, dir, sd, hub, config, size, per)
	es := make([]*testEngine, size)
	for i := range es {
		es[i] = dialEngine(t, rs[i/per].sock, uint32(i), size)
		if err := es[i].register(ctx); err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
		if es[i].reg.GroupTransport != GroupTCP || es[i].reg.OwnerLanes != size {
			t.Fatalf("rank %d: group transport %q, owner lanes %d", i, es[i].reg.GroupTransport, es[i].reg.OwnerLanes)
		}
	}
	keys := make([][]pagehash.Hash, 24)
	for i := range keys {
		keys[i] = chain(fmt.Sprintf("tcpn-%d", i%8), 8, 12, fmt.Sprintf("t%d", i))
	}
	driveKeys(t, ctx, es, "tcpn-a", keys)
	hit, _ := driveKeys(t, ctx, es, "tcpn-b", keys)
	digests := equalDigests(t, ctx, es)
	wrong, verified := 0, 0
	for _, e := range es {
		wrong, verified = wrong+e.wrong, verified+e.verified
	}
	t.Logf("%d hit pages on the second pass, %d verified, %d digest ticks equal on %d ranks of %d nodes", hit, verified, digests, size, size/per)
	if hit == 0 || wrong != 0 || digests == 0 || verified == 0 {
		t.Fatalf("%d hit pages, %d wrong, %d verified, %d digest ticks", hit, wrong, verified, digests)
	}
	if err := rs[1].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-rs[1].done
	rs[1].done <- nil
	outs := make([]*pb.StepReply, per)
	var wg sync.WaitGroup
	for i := range per {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], _ = es[i].run(ctx, &pb.StepRequest{}, nil)
		}()
	}
	wg.Wait()
	for i, out := range outs {
		if out != nil && (len(out.Errors) == 0 || out.Errors[0].Code != pb.ErrorCode_ERROR_CODE_UNAVAILABLE) {
			t.Errorf("rank %d: a step with node 1 dead: errors %v, want UNAVAILABLE", i, out.Errors)
		}
	}
	select {
	case err := <-rs[0].done:
		rs[0].done <- err
		var ee *exec.ExitError
		if err == nil || !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("node 0 exited with %v, want status 1", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("node 0 still runs 15 s after node 1 died:\n%s", rs[0].out.String())
	}
	for _, e := range es {
		e.close()
	}
}

// TestTCPGroupConfigRefused: a tcp group configuration that cannot work is
// refused at Open with an error naming the field, before any tier opens.
func TestTCPGroupConfigRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"a machine a rank, two ranks a process", Config{Ranks: 2, GroupSize: 4, GroupHub: "127.0.0.1:1", MachinePerRank: true}, "one rank per process"},
		{"ranks do not divide the size", Config{Ranks: 2, GroupSize: 3, GroupHub: "127.0.0.1:1"}, "not a multiple of the 2 ranks"},
		{"first rank not a multiple", Config{Ranks: 2, GroupRank: 1, GroupSize: 4, GroupHub: "127.0.0.1:1"}, "from a multiple of 2"},
		{"no size", Config{GroupHub: "127.0.0.1:1"}, "group size 0"},
		{"rank outside", Config{GroupRank: 4, GroupSize: 4, GroupHub: "127.0.0.1:1"}, "rank 4 outside a group of 4"},
		{"negative rank", Config{GroupRank: -1, GroupSize: 4, GroupHub: "127.0.0.1:1"}, "rank -1 outside"},
		{"no hub", Config{GroupSize: 2}, "no hub address"},
		{"remote hub", Config{GroupSize: 2, GroupHub: "10.1.2.3:7000"}, "not loopback"},
		{"bad hub", Config{GroupSize: 2, GroupHub: "nowhere"}, "nowhere"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Group, cfg.DataDir, cfg.Socket = GroupTCP, t.TempDir(), "/nonexistent/s.sock"
			s, err := Open(context.Background(), cfg)
			if err == nil {
				s.closeRanks(context.Background())
				t.Fatalf("Open accepted %+v", tc.cfg)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to say %q", err, tc.want)
			}
		})
	}
}

// TestEmptyNamedConfigRefused: a config file with nothing in it (a name
// given, no text) is refused at Open, naming the file, as `kvtier config
// validate` refuses it; only no config at all means the embedded
// default. The same for the store door's --store-config.
func TestEmptyNamedConfigRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"stack", Config{ConfigName: "empty.yaml"}, "empty.yaml"},
		{"stack, two ranks", Config{ConfigName: "empty.yaml", Ranks: 2}, "empty.yaml"},
		{"store door", Config{Doors: []string{DoorStore}, StoreConfigName: "empty-store.yaml"}, "empty-store.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.DataDir, cfg.Socket = t.TempDir(), filepath.Join(t.TempDir(), "s.sock")
			s, err := Open(context.Background(), cfg)
			if err == nil {
				s.closeRanks(context.Background())
				t.Fatalf("Open accepted an empty %s", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "config is empty") {
				t.Fatalf("error %q, want it to name %s and say the config is empty", err, tc.want)
			}
		})
	}
}

// TestSocketPathTooLong: a socket path longer than a unix socket's holds
// is refused at Open, saying so, before any tier opens; the longest one
// binds.
func TestSocketPathTooLong(t *testing.T) {
	dir := t.TempDir()
	long := filepath.Join(dir, strings.Repeat("s", maxSocketPath-len(dir)))
	if len(long) != maxSocketPath+1 {
		t.Fatalf("test path of %d bytes, want %d", len(long), maxSocketPath+1)
	}
	_, err := Open(context.Background(), Config{DataDir: t.TempDir(), Socket: long})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%d bytes, a unix socket's path holds at most %d", maxSocketPath+1, maxSocketPath)) {
		t.Fatalf("Open with a socket path of %d bytes: %v", len(long), err)
	}
	l, err := listenUnix(long[:maxSocketPath])
	if err != nil {
		t.Fatalf("listen on a path of %d bytes: %v", maxSocketPath, err)
	}
	l.Close()
}

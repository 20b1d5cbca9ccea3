package serve

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/pagehash"
)

// buildKvtier builds the kvtier binary once per test binary.
func buildKvtier(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := filepath.Join(t.TempDir(), "kvtier")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/kvtier")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startProcess runs `kvtier serve` and waits for its socket.
func startProcess(t *testing.T, bin, dir, sock string, args ...string) *exec.Cmd {
	t.Helper()
	os.Remove(sock) // a SIGKILLed serve leaves its socket; serve removes it too
	cmd := exec.Command(bin, append([]string{"serve", "--data-dir", dir, "--socket", sock, "--log-level", "warn"}, args...)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for i := 0; ; i++ {
		// The file exists from bind(), before listen(): wait for a dial
		// to be accepted.
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			if c, err := net.Dial("unix", sock); err == nil {
				c.Close()
				if fi.Mode().Perm() != 0o600 {
					t.Fatalf("socket mode %v, want 0600", fi.Mode().Perm())
				}
				return cmd
			}
		}
		if i > 1000 {
			t.Fatal("kvtier serve did not listen within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestProcessKillAndTerm: a real `kvtier serve` process is SIGKILLed after
// a first run; a restart on the same data dir finds the pages in L3 (cold
// start load), byte for byte; SIGTERM then drains it to a clean exit that
// removes its socket.
func TestProcessKillAndTerm(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvtier serve processes (-short)")
	}
	ctx := context.Background()
	bin := buildKvtier(t)
	dir := t.TempDir()
	sd, _ := os.MkdirTemp("", "kvp")
	defer os.RemoveAll(sd)
	sock, maddr := filepath.Join(sd, "s.sock"), freePort(t)
	cmd := startProcess(t, bin, dir, sock, "--metrics", maddr)
	e := dialEngine(t, sock, 0, 1)
	if err := e.register(ctx); err != nil {
		t.Fatal(err)
	}
	keys := make([][]pagehash.Hash, 8)
	for i := range keys {
		keys[i] = chain(reqName(i), 12, 12, "")
		drive(t, ctx, e, reqName(i), keys[i])
	}
	// Step until the L3 holds pages and no spill is queued or in flight
	// (twice in a row): the SIGKILL below then finds them durable, however
	// slowly the machine runs serve's lowered spill threads.
	deadline := time.Now().Add(60 * time.Second)
	for settled := 0; settled < 2; {
		if _, err := e.run(ctx, &pb.StepRequest{}, nil); err != nil {
			t.Fatal(err)
		}
		m, l3 := scrapeMetrics(t, maddr), map[string]string{"rank": "0", "tier": "l3"}
		used, inflight := m.value("kvtier_tier_used_pages", l3), m.value("kvtier_tier_inflight_operations", l3)
		queued := m.value("kvtier_tier_queue_depth", map[string]string{"rank": "0"})
		if used > 0 && inflight == 0 && queued == 0 {
			settled++
		} else {
			settled = 0
		}
		if time.Now().After(deadline) {
			t.Fatalf("the L3 did not settle within 60 s: used %v, in flight %v, queued %v", used, inflight, queued)
		}
		time.Sleep(20 * time.Millisecond)
	}
	old := e.reg.BootId
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// While serve is away a step fails; the engine treats it as a miss.
	if _, err := e.run(ctx, &pb.StepRequest{}, nil); err == nil {
		t.Fatal("a step succeeded with serve killed")
	}
	cmd = startProcess(t, bin, dir, sock)
	e.close()
	e = dialEngine(t, sock, 0, 1)
	if err := e.register(ctx); err != nil {
		t.Fatal(err)
	}
	if e.reg.BootId == old {
		t.Fatal("the restarted serve has the old boot_id")
	}
	var l3 uint32
	for i := range keys {
		l3 += drive(t, ctx, e, "again"+reqName(i), keys[i]).L3Hit
	}
	if l3 == 0 || e.wrong != 0 {
		t.Fatalf("after SIGKILL and restart: %d L3 hit pages, %d wrong (verified %d)", l3, e.wrong, e.verified)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	werr := make(chan error, 1)
	go func() { werr <- cmd.Wait() }()
	select {
	case err := <-werr:
		if err != nil {
			t.Fatalf("serve after SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not exit within 20 s of SIGTERM")
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left after a clean stop: %v", err)
	}
}

// TestSessionReplacedRollsBack: ranks of one engine step in lockstep
// through serve's rank group; when rank 0's engine re-registers (it
// restarted mid-step, plans owed), its plans are rolled back and every
// rank moves to a new epoch with empty Machines (the engine's L1 is gone);
// the other rank's session ends with it. After both register again they
// cache and hit again, the same answers on both ranks, every byte right.
func TestSessionReplacedRollsBack(t *testing.T) {
	ctx := context.Background()
	s, sock, _ := startServer(t, t.TempDir(), 2)
	es := []*testEngine{dialEngine(t, sock, 0, 2), dialEngine(t, sock, 1, 2)}
	for _, e := range es {
		if err := e.register(ctx); err != nil {
			t.Fatal(err)
		}
	}
	key := chain("x", 8, 8, "")
	driveGroup(t, ctx, es, "g0", key)
	if r := driveGroup(t, ctx, es, "g1", key); r[0].HitPages != 8 || r[0].L1Hit != 8 {
		t.Fatalf("second request: %v", r[0])
	}
	ek := chain("y", 8, 8, "")
	lookupGroup(t, ctx, es, "y", ek)
	outs := stepAll(t, ctx, es, func() *pb.StepRequest {
		return &pb.StepRequest{Stores: []*pb.Store{{ReqId: "y", Pages: 8, Hashes: packHashes(ek)}}}
	}, map[string][]pagehash.Hash{"y": ek})
	if len(outs[0].Plans) == 0 {
		t.Fatalf("no plans owed: %v", outs[0])
	}
	es[0].done = nil // rank 0's engine died before running them
	if err := es[0].register(ctx); err != nil {
		t.Fatal(err)
	}
	if n := s.ranks[0].stats.rolledBack.Load(); n == 0 {
		t.Fatal("no plan rolled back")
	}
	// Rank 1's session ended with the group.
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, err := es[1].run(ctx, &pb.StepRequest{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Errors) > 0 && out.Errors[0].Item == "session" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rank 1's session did not end with rank 0's: %v", out)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := es[1].register(ctx); err != nil {
		t.Fatal(err)
	}
	r := driveGroup(t, ctx, es, "g2", key)
	if r[0].L1Hit != 0 {
		t.Fatalf("after the new epoch: %d L1 hit pages from an engine that has none", r[0].L1Hit)
	}
	r = driveGroup(t, ctx, es, "g3", key)
	if r[0].HitPages != 8 || es[0].wrong != 0 || es[1].wrong != 0 {
		t.Fatalf("after re-registering: hit %d, wrong %d/%d", r[0].HitPages, es[0].wrong, es[1].wrong)
	}
}

// TestDisconnectRollsBack: a client whose connection closes mid-flight
// (plans owed) has its session ended at once, its plans rolled back; a
// new engine on the rank starts clean and reads only what it wrote.
func TestDisconnectRollsBack(t *testing.T) {
	ctx := context.Background()
	s, sock, _ := startServer(t, t.TempDir(), 1)
	a := dialEngine(t, sock, 0, 1)
	if err := a.register(ctx); err != nil {
		t.Fatal(err)
	}
	key := chain("d", 8, 8, "")
	drive(t, ctx, a, "warm", key)
	ek := chain("e", 8, 8, "")
	lookupGroup(t, ctx, []*testEngine{a}, "x", ek)
	out, err := a.run(ctx, &pb.StepRequest{Stores: []*pb.Store{{ReqId: "x", Pages: 8, Hashes: packHashes(ek)}}}, map[string][]pagehash.Hash{"x": ek})
	if err != nil || len(out.Plans) == 0 {
		t.Fatalf("no plans owed: %v %v", err, out)
	}
	a.conn.Close()
	deadline := time.Now().Add(5 * time.Second)
	for s.sessionCount() != 0 || s.ranks[0].stats.rolledBack.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after the disconnect: %d sessions, %d plans rolled back", s.sessionCount(), s.ranks[0].stats.rolledBack.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	b := dialEngine(t, sock, 0, 1)
	if err := b.register(ctx); err != nil {
		t.Fatal(err)
	}
	drive(t, ctx, b, "b1", key)
	res := drive(t, ctx, b, "b2", key)
	if res.HitPages != 8 || b.wrong != 0 {
		t.Fatalf("new engine: hit %d, wrong %d", res.HitPages, b.wrong)
	}
}

// TestGroupLoad: three ranks of one engine in lockstep through serve's
// rank group, a working set larger than L2 (spills to L3 and reloads):
// every step gives every rank the same answers, the digests compared
// every 64 ticks never differ, and every hit byte is right.
func TestGroupLoad(t *testing.T) {
	ctx := context.Background()
	s, sock, _ := startServer(t, t.TempDir(), 3)
	es := []*testEngine{dialEngine(t, sock, 0, 3), dialEngine(t, sock, 1, 3), dialEngine(t, sock, 2, 3)}
	for _, e := range es {
		if err := e.register(ctx); err != nil {
			t.Fatal(err)
		}
	}
	keys := make([][]pagehash.Hash, 110)
	for i := range keys {
		keys[i] = chain(fmt.Sprintf("g-%d", i), 12, 12, "")
	}
	driveKeys(t, ctx, es, "a", keys)
	_, l3 := driveKeys(t, ctx, es, "b", keys[:20])
	ticks := s.ranks[0].node.Ticks()
	t.Logf("%d ticks, %d L3 hit pages per rank, verified %d/%d/%d", ticks, l3, es[0].verified, es[1].verified, es[2].verified)
	if l3 == 0 || ticks < 64 {
		t.Fatalf("the load did not reach L3 (%d pages) or a digest tick (%d ticks)", l3, ticks)
	}
	for i, e := range es {
		if e.wrong != 0 {
			t.Fatalf("rank %d: %d wrong pages", i, e.wrong)
		}
	}
}

// TestServeEngineGroup: two ranks whose group transport is the engine:
// every step returns the rank's contribution, the engine all-reduces them
// (consensus.ReduceEncoded) and sends the frontier in each rank's next
// step. The ranks answer alike, hits come back verified, a step without
// the frontier it owes is refused whole, and a frontier that does not fit
// (damaged, or from an earlier epoch) stops the group with an error that
// says so: the sessions end and registering again works.
func TestServeEngineGroup(t *testing.T) {
	ctx := context.Background()
	s, sock, _ := startWith(t, Config{DataDir: t.TempDir(), Ranks: 2, Group: GroupEngine})
	es := []*testEngine{dialEngine(t, sock, 0, 2), dialEngine(t, sock, 1, 2)}
	register := func() {
		t.Helper()
		for _, e := range es {
			if err := e.register(ctx); err != nil {
				t.Fatal(err)
			}
			if e.reg.GroupTransport != GroupEngine {
				t.Fatalf("group transport %q, want %q", e.reg.GroupTransport, GroupEngine)
			}
			e.engineGroup = true
		}
	}
	register()
	keys := make([][]pagehash.Hash, 20)
	for i := range keys {
		keys[i] = chain(fmt.Sprintf("eg-%d", i%10), 6, 10, fmt.Sprintf("t%d", i))
	}
	driveKeys(t, ctx, es, "eg-a", keys)
	hit, _ := driveKeys(t, ctx, es, "eg-b", keys)
	if hit == 0 || es[0].wrong+es[1].wrong != 0 {
		t.Fatalf("%d hit pages, %d+%d wrong", hit, es[0].wrong, es[1].wrong)
	}
	t.Logf("%d hit pages on the second pass, %d+%d verified", hit, es[0].verified, es[1].verified)

	// A step without the frontier it owes: refused whole, the session
	// stays, and the same step with the frontier goes on.
	e := es[0]
	e.step++
	out, err := e.cl.Step(ctx, &pb.StepRequest{Session: e.reg.Session, BootId: e.reg.BootId, Step: e.step})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Errors) != 1 || out.Errors[0].Item != "frontier" || out.Errors[0].Code != pb.ErrorCode_ERROR_CODE_STATE || len(out.Contribution) == 0 {
		t.Fatalf("step without its frontier: %v (contribution %d bytes)", out.Errors, len(out.Contribution))
	}
	e.step--
	driveGroup(t, ctx, es, "eg-after-missing", keys[0])

	// A damaged frontier stops the group.
	stale := bytes.Clone(e.frontier)
	bad := bytes.Clone(e.frontier)
	bad[len(bad)-1] ^= 0xff
	bad[60] ^= 0x01
	outs := make([]*pb.StepReply, 2)
	for i, e := range es {
		f := e.frontier
		if i == 0 {
			f = bad
		}
		if outs[i], err = e.run(ctx, &pb.StepRequest{Frontier: f}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if len(outs[0].Errors) == 0 || outs[0].Errors[0].Code != pb.ErrorCode_ERROR_CODE_UNAVAILABLE {
		t.Fatalf("damaged frontier: %v, want UNAVAILABLE", outs[0].Errors)
	}
	t.Logf("damaged frontier: %s", outs[0].Errors[0].Message)
	// Rank 1's session ended with the group (asynchronously).
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, err := es[1].run(ctx, &pb.StepRequest{Frontier: es[1].frontier}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Errors) > 0 && out.Errors[0].Code == pb.ErrorCode_ERROR_CODE_UNKNOWN {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rank 1 still in session after the group stopped: %v", out.Errors)
		}
		time.Sleep(10 * time.Millisecond)
	}
	register()
	hit, _ = driveKeys(t, ctx, es, "eg-c", keys[:5])
	if es[0].wrong+es[1].wrong != 0 {
		t.Fatalf("%d+%d wrong pages after the new epoch", es[0].wrong, es[1].wrong)
	}
	t.Logf("after the new epoch: %d hit pages", hit)
	// A frontier reduced in the earlier epoch is foreign to this one.
	out, err = es[0].run(ctx, &pb.StepRequest{Frontier: stale}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Errors) == 0 || out.Errors[0].Code != pb.ErrorCode_ERROR_CODE_UNAVAILABLE || !strings.Contains(out.Errors[0].Message, "group") {
		t.Fatalf("frontier of an earlier epoch: %v, want UNAVAILABLE naming the group", out.Errors)
	}
	t.Logf("stale frontier: %s", out.Errors[0].Message)
	if st := s.ranks[0].stats.steps.Load(); st == 0 {
		t.Fatal("no step counted")
	}
}

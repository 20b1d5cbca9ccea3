package loadgen

import (
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

	"github.com/kvtier/kvtier/workload"
)

func buildKvtier(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	bin := filepath.Join(t.TempDir(), "kvtier")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/kvtier")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func startServe(t *testing.T, bin, dir, sock string, ranks string, extra ...string) *exec.Cmd {
	t.Helper()
	os.Remove(sock)
	cmd := exec.Command(bin, append([]string{"serve", "--data-dir", dir, "--socket", sock, "--ranks", ranks, "--log-level", "error"}, extra...)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// SIGTERM first: a serve that drains removes its shm slab files;
		// a SIGKILL leaves them in /dev/shm (RAM) under a data dir no
		// later serve opens to clear them (about 170 MiB a run).
		if cmd.ProcessState != nil {
			return
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	for i := 0; ; i++ {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return cmd
		}
		if i > 1000 {
			t.Fatal("kvtier serve did not listen within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLoadgenAgainstServe: two rank sessions drive a real kvtier serve
// process with the generated workload: hits, every byte verified, no
// error; then serve is SIGKILLed and restarted on the same data dir, and
// a second run finds L3 pages (cold start load), still 0 wrong bytes. The
// backups report their sums (Completion.sums) and serve takes them.
func TestLoadgenAgainstServe(t *testing.T) {
	if testing.Short() {
		t.Skip("runs kvtier serve processes (-short)")
	}
	ctx := context.Background()
	bin := buildKvtier(t)
	for _, lanes := range []bool{false, true} {
		t.Run(map[bool]string{false: "replicas", true: "owner-lanes"}[lanes], func(t *testing.T) {
			var extra []string
			if lanes {
				extra = []string{"--owner-lanes"}
			}
			dir := t.TempDir()
			sd, _ := os.MkdirTemp("", "klg")
			defer os.RemoveAll(sd)
			sock := filepath.Join(sd, "s.sock")
			cmd := startServe(t, bin, dir, sock, "2", extra...)
			g := workload.DefaultGeneratorConfig()
			g.Seed, g.Requests = 3, 600
			reqs, err := workload.Generate(g)
			if err != nil {
				t.Fatal(err)
			}
			res, err := Run(ctx, Config{Socket: sock, Ranks: 2, Requests: reqs})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("first run: %+v", res)
			if res.WrongBytes != 0 || res.Errors != 0 || res.VerifiedPages == 0 || res.HitRate <= 0 || res.Requests != int64(len(reqs)) {
				t.Fatalf("first run: %+v", res)
			}
			// Every backup reports its items' sums, and serve accepts
			// them (a refused completion is an error above).
			if res.SummedItems == 0 || res.SummedItems > res.CopyItems {
				t.Fatalf("first run: %d items reported with sums of %d copied", res.SummedItems, res.CopyItems)
			}
			// The copies' limit is measured beside them (about a quarter
			// of their bytes), and the idle one after the run.
			if res.MemcpyGBps <= 0 || res.MemcpyAfterGBps <= 0 || res.LoadRatio <= 0 || res.StoreRatio <= 0 || res.CopyShare <= 0 || res.CopyShare > 1 {
				t.Fatalf("first run: limits %.2f and %.2f GB/s, ratios %.2f and %.2f, copy share %.3f", res.MemcpyGBps, res.MemcpyAfterGBps, res.LoadRatio, res.StoreRatio, res.CopyShare)
			}
			if want := map[bool]int{false: 1, true: 2}[lanes]; res.OwnerLanes != want {
				t.Fatalf("owner lanes %d, want %d", res.OwnerLanes, want)
			}
			if lanes {
				// The embedded shared stack: one index, both ranks' L3
				// slab files in one directory.
				if _, err := os.Stat(filepath.Join(dir, "index", "data.mdb")); err != nil {
					t.Fatalf("the ranks' shared index: %v", err)
				}
				for r := range 2 {
					if m, _ := filepath.Glob(filepath.Join(dir, "l3", fmt.Sprintf("kvtier-l3-serve-r%d-k*.slab", r))); len(m) == 0 {
						t.Fatalf("no L3 slab file of rank %d in the shared directory", r)
					}
				}
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			startServe(t, bin, dir, sock, "2", extra...)
			res, err = Run(ctx, Config{Socket: sock, Ranks: 2, Requests: reqs})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("after SIGKILL and restart: %+v", res)
			if res.WrongBytes != 0 || res.Errors != 0 || res.HitTokensByTier["l3"] == 0 {
				t.Fatalf("after the restart: %+v", res)
			}
		})
	}
}

func TestKey(t *testing.T) {
	a := Key([]uint64{1, 2, 3}, 16, 64)
	b := Key([]uint64{1, 2, 4}, 16, 64)
	if len(a) != 3 || a[0] != b[0] || a[1] != b[1] || a[2] == b[2] {
		t.Fatal("keys do not share exactly the common prefix")
	}
	if len(Key([]uint64{1, 2, 3}, 16, 2)) != 2 {
		t.Fatal("max pages not applied")
	}
}

// TestResultCheck: a run fails, saying why, on wrong bytes, on any error
// and on a run that verified nothing; a clean run passes.
func TestResultCheck(t *testing.T) {
	for _, tc := range []struct {
		name      string
		res       Result
		verifying bool
		want      string // "" passes
	}{
		{"clean", Result{Requests: 10, VerifiedPages: 5}, true, ""},
		{"wrong bytes", Result{Requests: 10, VerifiedPages: 5, WrongBytes: 3}, true, "3 wrong bytes"},
		{"errors", Result{Requests: 10, VerifiedPages: 5, Errors: 14, FirstError: "rank 0: step: boom"}, true, "14 errors (first: rank 0: step: boom)"},
		{"nothing verified", Result{Requests: 10}, true, "no page verified"},
		{"errors and nothing verified", Result{Requests: 10, Errors: 14}, true, "14 errors; no page verified"},
		{"not verifying", Result{Requests: 10}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.res.Check(tc.verifying)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Check: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

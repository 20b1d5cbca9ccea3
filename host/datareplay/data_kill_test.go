package datareplay

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvtier/kvtier/tiers"
)

const killDirEnv = "KVTIER_TEST_DATA_KILL_DIR"

// TestDataKillChild is the child of TestDataSIGKILL: a data replay of the
// whole shared trace on l3disk under the given directory, printing its
// progress, until it is killed.
func TestDataKillChild(t *testing.T) {
	dir := os.Getenv(killDirEnv)
	if dir == "" {
		t.Skip("run by TestDataSIGKILL only")
	}
	tr := headTrace(t, 4000)
	_, err := RunData(context.Background(), tr, DataConfig{Dir: dir, Progress: func(n int) {
		if n%25 == 0 {
			fmt.Printf("progress %d\n", n)
		}
	}})
	t.Fatalf("the child was not killed: %v", err)
}

// TestDataSIGKILL kills a data replay on l3disk with SIGKILL in the middle
// of the shared trace, then replays again on the same directory with cold
// start "load": what was durable before the kill serves L3 hits, and no
// byte is wrong.
func TestDataSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	headTrace(t, 1) // skip without the shared trace
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestDataKillChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), killDirEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		last := ""
		for sc.Scan() {
			last = sc.Text()
			if last == "progress 300" {
				_ = cmd.Process.Signal(syscall.SIGKILL)
				killed <- last
				return
			}
		}
		killed <- "child ended: " + last
	}()
	select {
	case what := <-killed:
		if !strings.HasPrefix(what, "progress") {
			t.Fatalf("the child stopped before the kill: %s", what)
		}
	case <-time.After(120 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the child made no progress in 120 s")
	}
	err = cmd.Wait()
	t.Logf("child: %v", err)

	tr := headTrace(t, 200)
	res, err := RunData(context.Background(), tr, DataConfig{Dir: dir, ColdStart: tiers.ColdStartLoad})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after SIGKILL, cold start load: hit rate %.4f by tier %v, verified %d, wrong %d, failed %v", res.HitRate, res.HitPagesByTier, res.VerifiedPages, res.WrongBytes, res.FailedOps)
	if res.WrongBytes != 0 {
		t.Fatalf("%d wrong bytes after the restart", res.WrongBytes)
	}
	if res.HitPagesByTier["l3"] == 0 {
		t.Fatal("no L3 hit after the restart with cold start load")
	}
}

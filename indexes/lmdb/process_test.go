package lmdb

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvtier/kvtier/indexes"
)

const (
	childModeEnv = "KVTIER_LMDB_INDEX_CHILD_MODE"
	childDirEnv  = "KVTIER_LMDB_INDEX_CHILD_DIR"
	childSeedEnv = "KVTIER_LMDB_INDEX_CHILD_SEED"
)

// TestChild is the body of the child processes started by the multi-process
// tests; it does nothing in a normal run.
func TestChild(t *testing.T) {
	mode := os.Getenv(childModeEnv)
	if mode == "" {
		t.Skip("child process of the multi-process tests only")
	}
	dir := os.Getenv(childDirEnv)
	var seed uint64
	if _, err := fmt.Sscan(os.Getenv(childSeedEnv), &seed); err != nil {
		t.Fatalf("child seed: %v", err)
	}
	ix := openAt(t, dir, DefaultConfig())
	defer ix.Close()
	entries := entriesFor(rand.New(rand.NewPCG(seed, 0)), 500)
	switch mode {
	case "write":
		if err := ix.Put(context.Background(), entries); err != nil {
			t.Fatalf("child put: %v", err)
		}
	case "read":
		expectPresent(t, ix, entries)
	case "hold-env":
		fmt.Println("env-open")
		_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes stdin
	case "fill-readers":
		// Take every reader slot with read transactions that never end,
		// say so, and wait to be killed.
		full := make(chan error, 1)
		for i := 0; ; i++ {
			held := make(chan struct{}, 1)
			go func() {
				err := ix.Iterate(context.Background(), func(indexes.Entry) error {
					held <- struct{}{}
					time.Sleep(time.Hour)
					return nil
				})
				full <- err
			}()
			select {
			case <-held:
				continue
			case err := <-full:
				if !strings.Contains(fmt.Sprint(err), "reader slot") {
					t.Fatalf("reader %d: %v, want every reader slot taken", i, err)
				}
			}
			fmt.Printf("readers-full %d\n", i)
			break
		}
		time.Sleep(time.Hour)
	case "write-many":
		// Write batches while the parent does the same.
		rng := rand.New(rand.NewPCG(seed, 1))
		for range 40 {
			if err := ix.Put(context.Background(), entriesFor(rng, 50)); err != nil {
				t.Fatalf("child put: %v", err)
			}
		}
	case "hold-reader":
		// Open a read transaction, say so, and wait to be killed.
		if err := ix.Put(context.Background(), entries[:1]); err != nil {
			t.Fatalf("child put: %v", err)
		}
		_ = ix.Iterate(context.Background(), func(indexes.Entry) error {
			fmt.Println("reader-open")
			time.Sleep(time.Hour)
			return nil
		})
		t.Fatal("hold-reader child was not killed")
	default:
		t.Fatalf("unknown child mode %q", mode)
	}
}

func child(t *testing.T, mode, dir string, seed uint64) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), childModeEnv+"="+mode, childDirEnv+"="+dir, fmt.Sprintf("%s=%d", childSeedEnv, seed))
	return cmd
}

func runChild(t *testing.T, mode, dir string, seed uint64) {
	t.Helper()
	out, err := child(t, mode, dir, seed).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestChild") {
		t.Fatalf("child %s: %v\n%s", mode, err, out)
	}
}

// TestTwoProcesses shares one environment between this process and a child
// process, both open at once: the child reads what the parent wrote, and
// the parent reads what the child wrote, through its still-open handle.
func TestTwoProcesses(t *testing.T) {
	dir := t.TempDir()
	ix := openAt(t, dir, DefaultConfig())
	defer ix.Close()
	parentEntries := entriesFor(rand.New(rand.NewPCG(100, 0)), 500)
	if err := ix.Put(context.Background(), parentEntries); err != nil {
		t.Fatal(err)
	}
	runChild(t, "read", dir, 100)
	runChild(t, "write", dir, 200)
	childEntries := entriesFor(rand.New(rand.NewPCG(200, 0)), 500)
	expectPresent(t, ix, append(parentEntries, childEntries...))
	st, err := ix.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Entries != 1000 {
		t.Fatalf("stats entries = %d after 500 + 500 puts from two processes", st.Entries)
	}
}

// startChild starts a child in mode and waits until it prints ready.
func startChild(t *testing.T, mode, dir, ready string) (*exec.Cmd, io.WriteCloser) {
	t.Helper()
	cmd := child(t, mode, dir, 1)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if strings.Contains(lines.Text(), ready) {
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			return cmd, stdin
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	t.Fatalf("child %s exited before printing %q", mode, ready)
	return nil, nil
}

func killChild(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil {
		t.Fatal("child exited cleanly; it should have been killed inside its read transaction")
	}
}

// TestStaleReaderCleared kills a child process inside a read transaction
// while another process keeps the environment open (so LMDB does not
// simply reset its lock file), and checks that the next Open clears the
// dead child's reader slot, as does ClearStaleReaders on a handle that was
// already open.
func TestStaleReaderCleared(t *testing.T) {
	dir := t.TempDir()
	holder, holderStdin := startChild(t, "hold-env", dir, "env-open")
	defer func() {
		_ = holderStdin.Close()
		if err := holder.Wait(); err != nil {
			t.Errorf("holder child: %v", err)
		}
	}()
	reader, _ := startChild(t, "hold-reader", dir, "reader-open")
	killChild(t, reader)
	ix := openAt(t, dir, DefaultConfig())
	if got := ix.StaleReadersCleared(); got != 1 {
		t.Fatalf("open cleared %d stale reader slots, want the killed child's 1", got)
	}
	reader, _ = startChild(t, "hold-reader", dir, "reader-open")
	killChild(t, reader)
	n, err := ix.ClearStaleReaders()
	if err != nil || n != 1 {
		t.Fatalf("ClearStaleReaders = %d, %v; want 1 slot", n, err)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestReaderTableFullRecovers fills the shared reader table from a child
// process that is then killed inside all its read transactions: the
// parent's next lookup finds no free slot, clears the dead child's slots
// and succeeds without a reopen.
func TestReaderTableFullRecovers(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.MaxReaders = minMaxReaders // the lock file rounds it up to one page of slots
	ix := openAt(t, dir, cfg)
	defer ix.Close()
	entries := entriesFor(rand.New(rand.NewPCG(6, 6)), 5)
	if err := ix.Put(context.Background(), entries); err != nil {
		t.Fatal(err)
	}
	filler, _ := startChild(t, "fill-readers", dir, "readers-full")
	killChild(t, filler)
	expectPresent(t, ix, entries)
}

// TestTwoProcessesWriteAtOnce has a child and the parent write batches into
// one environment at the same time; LMDB's cross-process writer lock
// serializes them and every batch of both lands.
func TestTwoProcessesWriteAtOnce(t *testing.T) {
	dir := t.TempDir()
	ix := openAt(t, dir, DefaultConfig())
	defer ix.Close()
	cmd := child(t, "write-many", dir, 300)
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mine []indexes.Entry
	rng := rand.New(rand.NewPCG(400, 1))
	for range 40 {
		batch := entriesFor(rng, 50)
		if err := ix.Put(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
		mine = append(mine, batch...)
	}
	if err := cmd.Wait(); err != nil || !strings.Contains(out.String(), "--- PASS: TestChild") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var theirs []indexes.Entry
	rng = rand.New(rand.NewPCG(300, 1))
	for range 40 {
		theirs = append(theirs, entriesFor(rng, 50)...)
	}
	expectPresent(t, ix, append(mine, theirs...))
	st, err := ix.Stats(context.Background())
	if err != nil || st.Entries != 4000 {
		t.Fatalf("stats %+v, %v; want 4000 entries from two writers", st, err)
	}
}

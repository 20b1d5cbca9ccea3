package pluginhost

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvtier/kvtier/tiers"
)

func TestProcGroupAliveOfThisProcess(t *testing.T) {
	pgid := syscall.Getpgrp()
	alive, err := procGroupAlive("/proc", pgid)
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	if !alive || !groupAlive(pgid) {
		t.Fatalf("the test's own process group %d reported gone", pgid)
	}
	if _, err := procGroupAlive(filepath.Join(t.TempDir(), "no-proc"), pgid); err == nil {
		t.Fatal("scanning a missing /proc succeeded")
	}
}

// scriptPlugin writes an executable shell script that records its pid in
// <script>.pid and returns its path and SHA-256.
func scriptPlugin(t *testing.T, name, body string) (path, sum string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), name)
	script := "#!/bin/sh\necho $$ > \"$0.pid\"\n" + body + "\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, fileSumHex(t, path)
}

// TestHandshakeFailureKillsProcessGroup: a plugin that fails its handshake
// but leaves a child holding its stdout is refused with the right error
// within the handshake timeout plus a small bound, and no process of its
// group survives (go-plugin kills only the pid and then reads stdout until
// every holder closes it: an hour for the last script).
func TestHandshakeFailureKillsProcessGroup(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	const startTimeout = time.Second
	const bound = 2 * time.Second
	cases := []struct {
		name    string
		body    string
		mention []string // any of them
	}{
		{"garbage then sleep", "echo 'garbage before the handshake'\nsleep 100", []string{`"garbage before the handshake" to stdout`}},
		{"silent then sleep", "sleep 100", []string{"no handshake within 1s"}},
		{"orphan holds stdout", "( sleep 3600 ) &\nexit 0", []string{"no handshake within 1s", "exited before the handshake"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path, sum := scriptPlugin(t, "plugin.sh", tc.body)
			opts := fastOptions()
			opts.StartTimeout = startTimeout
			start := time.Now()
			s, err := OpenStore(context.Background(), storeEnv(t, newSlab(t, 16*slot), nil), PluginSpec{Name: "script", Path: path, SHA256: sum, Options: opts})
			took := time.Since(start)
			if err == nil {
				s.Close()
				t.Fatal("a script that never handshakes opened")
			}
			if !errors.Is(err, ErrHandshake) {
				t.Fatalf("err = %v, want ErrHandshake", err)
			}
			found := false
			for _, m := range tc.mention {
				found = found || strings.Contains(err.Error(), m)
			}
			if !found {
				t.Fatalf("err = %q mentions none of %q", err, tc.mention)
			}
			if took > startTimeout+bound {
				t.Fatalf("refusal took %v, want at most the %v handshake timeout + %v", took, startTimeout, bound)
			}
			b, rerr := os.ReadFile(path + ".pid")
			if rerr != nil {
				t.Fatalf("the script did not record its pid: %v", rerr)
			}
			pgid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			if pgid <= 0 || groupAlive(pgid) {
				t.Fatalf("process group %d of the refused plugin still has a running process", pgid)
			}
		})
	}
}

// TestCloseDuringHungRestart: the plugin dies and its restart hangs in the
// handshake with a child holding its stdout (the default 10 s handshake
// timeout, then an hour for the child). Close abandons the restart, kills
// its process group and returns within CloseTimeout.
func TestCloseDuringHungRestart(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "hang")
	t.Setenv("KVTIER_FAULT_HANG_AT_START_MARKER", marker)
	opts := fastOptions()
	opts.StartTimeout = 10 * time.Second
	opts.CloseTimeout = 2 * time.Second
	h := newHarness(t, opts, 11)
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(h.store.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a restart hanging in its handshake", 10*time.Second, func() bool {
		b, _ := os.ReadFile(marker + ".pids")
		return len(b) > 0
	})
	start := time.Now()
	if err := h.store.Close(); err != nil {
		t.Fatalf("close while a restart hangs: %v", err)
	}
	if took := time.Since(start); took > opts.CloseTimeout+500*time.Millisecond {
		t.Fatalf("close took %v, limit %v", took, opts.CloseTimeout)
	}
	b, _ := os.ReadFile(marker + ".pids")
	for _, f := range strings.Fields(string(b)) {
		pgid, _ := strconv.Atoi(f)
		if pgid <= 0 || groupAlive(pgid) {
			t.Fatalf("process group %q of the hung restart still running after close", f)
		}
	}
}

// TestTimedOutGetNeverWritesAfterReturn: the plugin is slow, not dead: it
// sleeps until just before the call deadline and then keeps writing its
// Get destinations for a while, itself and from a child process that maps
// the slab (an I/O worker). The host returns misses at the deadline, and
// from then on the destination is the host's: nothing may change it. (With
// the plugin's pid killed alone, or killed after the call returned, the
// child's writes land in the reused spans.) A caller's own deadline,
// shorter than the call's, does not make Get return earlier.
func TestTimedOutGetNeverWritesAfterReturn(t *testing.T) {
	cases := []struct {
		name           string
		callerDeadline time.Duration // 0: none
		seed           uint64
	}{
		{"call deadline", 0, 12},
		{"shorter caller deadline", 100 * time.Millisecond, 15},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := fastOptions()
			opts.CallTimeout = 300 * time.Millisecond
			t.Setenv("KVTIER_FAULT_SLOW_GET", "2")
			t.Setenv("KVTIER_FAULT_SLOW_GET_SLEEP", "250ms")
			t.Setenv("KVTIER_FAULT_SLOW_GET_WRITE", "600ms")
			h := newHarness(t, opts, tc.seed)
			ps := h.pages(4)
			b := h.put(0, ps)
			h.drain(map[tiers.BatchID]int{b: 4}, 10*time.Second)
			if hits, _ := h.get(8, ps); hits != 4 {
				t.Fatalf("seed %d: %d of 4 hits before the slow get", tc.seed, hits)
			}
			// The slow get.
			reqs := make([]tiers.GetRequest, len(ps))
			for i, p := range ps {
				reqs[i] = tiers.GetRequest{Key: p.key, Dst: h.span(8 + i)}
			}
			res := make([]error, len(ps))
			ctx := context.Background()
			if tc.callerDeadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.callerDeadline)
				defer cancel()
			}
			if err := h.store.Get(ctx, reqs, res); err != nil {
				t.Fatalf("seed %d: slow get: %v, want misses", tc.seed, err)
			}
			for i, r := range res {
				if !errors.Is(r, ErrDown) || !errors.Is(r, tiers.ErrMiss) {
					t.Fatalf("seed %d: slow get item %d: %v, want a miss wrapping ErrDown", tc.seed, i, r)
				}
			}
			// The host reuses the destination spans at once.
			reused := h.pages(4)
			for i, p := range reused {
				d, _ := h.slab.Bytes(h.span(8 + i))
				copy(d, p.data)
			}
			time.Sleep(800 * time.Millisecond) // past the plugin's writing window (it ends 850ms after the call began)
			for i, p := range reused {
				d, _ := h.slab.Bytes(h.span(8 + i))
				if !bytes.Equal(d, p.data) {
					t.Fatalf("seed %d: destination %d changed after the timed-out get returned (the plugin wrote into a reused span)", tc.seed, i)
				}
			}
		})
	}
}

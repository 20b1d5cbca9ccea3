package serve

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/pagehash"
)

var rssFlag = flag.Bool("serve-rss", false, "run TestOversizeStepRSS (a real serve process, 250 MiB steps; slow)")

// peakRSS reads a process's peak resident set (VmHWM) in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmHWM:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// TestOversizeStepRSS (with -serve-rss) sends three 250 MiB Steps to a
// real `kvtier serve` with the default --max-message-bytes and with the
// earlier bound (256 MiB), and reports serve's peak RSS for each: with the
// default the steps are refused before they are read and the peak stays
// that of an idle serve.
func TestOversizeStepRSS(t *testing.T) {
	if !*rssFlag {
		t.Skip("a measurement: run with -serve-rss")
	}
	bin := buildKvtier(t)
	ctx := context.Background()
	var q pb.StepRequest
	for n := 0; n*(2048*pagehash.Size) < 250<<20; n++ {
		q.Lookups = append(q.Lookups, &pb.Lookup{ReqId: "l" + strconv.Itoa(n), Pages: 2048, Hashes: make([]byte, 2048*pagehash.Size)})
	}
	peaks := map[string]int64{}
	for _, tc := range []struct {
		name string
		args []string
		code codes.Code
	}{
		{"default 64 MiB", nil, codes.ResourceExhausted},
		{"256 MiB (before)", []string{"--max-message-bytes", strconv.Itoa(256 << 20)}, codes.OK},
	} {
		dir := t.TempDir()
		sd, err := os.MkdirTemp("", "kvr")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(sd)
		sock := filepath.Join(sd, "s.sock")
		cmd := startProcess(t, bin, dir, sock, tc.args...)
		idle := peakRSS(t, cmd.Process.Pid)
		e := dialEngine(t, sock, 0, 1)
		if err := e.register(ctx); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			_, err := e.run(ctx, &q, nil)
			if st, _ := status.FromError(err); st.Code() != tc.code {
				t.Fatalf("%s: a 250 MiB step: %v, want %v", tc.name, err, tc.code)
			}
		}
		drive(t, ctx, e, "after", chain("rss", 4, 4, ""))
		peaks[tc.name] = peakRSS(t, cmd.Process.Pid)
		t.Logf("%s: serve's peak RSS %d MiB (idle %d MiB)", tc.name, peaks[tc.name]>>20, idle>>20)
		_ = cmd.Process.Kill()
	}
	if peaks["default 64 MiB"]*2 > peaks["256 MiB (before)"] {
		t.Fatalf("peak RSS %d MiB with the default bound, %d MiB with 256 MiB: want under half", peaks["default 64 MiB"]>>20, peaks["256 MiB (before)"]>>20)
	}
}

package doctor

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
)

// TestOS runs the real System's probes in a temporary directory: they
// answer and leave nothing behind.
func TestOS(t *testing.T) {
	dir := t.TempDir()
	var sys OS
	if err := sys.ProbeODirect(dir); err != nil && !errors.Is(err, diskfs.ErrDirectRefused) {
		t.Errorf("ProbeODirect(%s): %v", dir, err)
	}
	res, err := sys.ProbePLP(dir, 2, "auto", time.Second)
	if err != nil || res.Probes != 2 || res.Median <= 0 {
		t.Errorf("ProbePLP: %+v, %v", res, err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("probes left %d files in %s", len(left), dir)
	}
	st, err := sys.Statfs(dir)
	if err != nil || st.BlockSize <= 0 || st.Device == 0 {
		t.Errorf("Statfs: %+v, %v", st, err)
	}
	if _, err := sys.Statfs(filepath.Join(dir, "absent")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Statfs of a missing path: %v, want ErrNotExist", err)
	}
	if _, err := sys.MemlockLimit(); err != nil {
		t.Errorf("MemlockLimit: %v", err)
	}
	bin := filepath.Join(dir, "plugin")
	if err := os.WriteFile(bin, []byte("abc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if sum, err := sys.FileSHA256(bin); err != nil || sum != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Errorf("FileSHA256: %s, %v", sum, err)
	}
	if err := sys.Access(bin, AccessExec); err != nil {
		t.Errorf("Access: %v", err)
	}
	if b, err := sys.ReadFile("/proc/self/status"); err != nil || len(b) == 0 {
		t.Errorf("ReadFile: %d bytes, %v", len(b), err)
	}
	if mi, err := sys.Meminfo(); err != nil || mi.MemTotal == nil {
		t.Errorf("Meminfo: %v", err)
	}
	if st, err := sys.SelfStatus(); err != nil || st.PID != os.Getpid() {
		t.Errorf("SelfStatus: pid %d, %v", st.PID, err)
	}
}

// TestOSDialUnix tells a live socket from the stale file a dead listener
// leaves.
func TestOSDialUnix(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	if err := (OS{}).DialUnix(path); err != nil {
		t.Errorf("live socket: %v", err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := (OS{}).DialUnix(path); err == nil {
		t.Error("stale socket file answered")
	}
}

package hugetest

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// TestSetup checks that Setup hands out a usable backing and, for
// hugetlbfs, that the mount reports its reserved pages through statfs.
func TestSetup(t *testing.T) {
	t.Run("setup", func(t *testing.T) {
		b := Setup(t, 2)
		var st unix.Statfs_t
		if err := unix.Statfs(b.Dir, &st); err != nil {
			t.Fatalf("statfs %s: %v", b.Dir, err)
		}
		switch b.Kind {
		case BackingHugetlbfs:
			if st.Type != unix.HUGETLBFS_MAGIC || st.Bsize != PageSize || st.Blocks != 2 || st.Bavail != 2 {
				t.Fatalf("hugetlbfs statfs: type %x bsize %d blocks %d avail %d; want hugetlbfs, 2 MiB, 2, 2", st.Type, st.Bsize, st.Blocks, st.Bavail)
			}
		case BackingShm:
			if b.Why == "" {
				t.Fatal("shm backing without a reason")
			}
		default:
			t.Fatalf("backing kind %q", b.Kind)
		}
		f, err := os.Create(b.Dir + "/probe")
		if err != nil {
			t.Fatalf("create a file on the backing: %v", err)
		}
		f.Close()
	})
}

// TestMountClose checks that Close unmounts and gives back exactly the
// pages it added (other test binaries may change the pool concurrently,
// so the pool's size itself is not compared).
func TestMountClose(t *testing.T) {
	m, err := NewMount(t.TempDir(), 1)
	if err != nil {
		t.Logf("hugetlbfs refused, nothing to close: %v", err)
		return
	}
	dir := m.Dir
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if m.added != 0 || m.mounted {
		t.Fatalf("after Close: %d pages still added, mounted %v", m.added, m.mounted)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("mount point %s still there: %v", dir, err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestStaleCandidate(t *testing.T) {
	opts := func(s string) map[string]string {
		m := map[string]string{}
		for _, o := range strings.Split(s, ",") {
			k, v, _ := strings.Cut(o, "=")
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		fsType, mountPoint, superOptions string
		dir                              string
		pages, owner                     int
		ok                               bool
	}{
		{"hugetlbfs", "/tmp/x/hugetlbfs-kvtier-4242-123", "rw,pagesize=2M,size=4194304,min_size=4194304", "/tmp/x/hugetlbfs-kvtier-4242-123", 2, 4242, true},
		{"hugetlbfs", "/tmp/hugetlbfs-123", "rw,pagesize=2M,size=4194304,min_size=4194304", "", 0, 0, false}, // not ours
		{"hugetlbfs", "/tmp/hugetlbfs-kvtier-x-1", "rw,min_size=4194304", "", 0, 0, false},                   // no pid
		{"hugetlbfs", "/tmp/hugetlbfs-kvtier-7-1", "rw,pagesize=2M", "", 0, 0, false},                        // no min_size
		{"hugetlbfs", "/tmp/hugetlbfs-kvtier-7-1", "rw,min_size=1000", "", 0, 0, false},                      // not whole pages
		{"tmpfs", "/tmp/hugetlbfs-kvtier-7-1", "rw,min_size=4194304", "", 0, 0, false},                       // not hugetlbfs
		{"", "", "", "", 0, 0, false},
	} {
		m := &procfs.MountInfo{FSType: tc.fsType, MountPoint: tc.mountPoint, SuperOptions: opts(tc.superOptions)}
		dir, pages, owner, ok := staleCandidate(m)
		if dir != tc.dir || pages != tc.pages || owner != tc.owner || ok != tc.ok {
			t.Errorf("staleCandidate(%+v) = %q, %d, %d, %v; want %q, %d, %d, %v", *m, dir, pages, owner, ok, tc.dir, tc.pages, tc.owner, tc.ok)
		}
	}
}

// TestSweepStale leaves a mount behind for a pid that no longer exists, as
// a SIGKILLed run would, and checks that the next NewMount's sweep removes
// it and returns its pages.
func TestSweepStale(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatalf("run a short-lived process: %v", err)
	}
	dead := cmd.Process.Pid // reaped: no process has this pid now (barring reuse)
	m, err := newMount(t.TempDir(), 1, dead)
	if err != nil {
		t.Logf("hugetlbfs refused, nothing to sweep: %v", err)
		return
	}
	swept, err := SweepStale()
	if err != nil {
		m.Close()
		t.Fatalf("SweepStale: %v", err)
	}
	if !slices.Contains(swept, m.Dir) {
		m.Close()
		t.Fatalf("swept %v, want the dead owner's mount %s", swept, m.Dir)
	}
	if _, err := os.Stat(m.Dir); !os.IsNotExist(err) {
		t.Fatalf("stale mount point %s still there: %v", m.Dir, err)
	}
	// NB: the pool's size is not compared: other test binaries reserve and
	// return pages concurrently. The sweep returns min_size/2 MiB pages,
	// which TestParseStaleCandidate pins.
	// The sweep took the page back: the mount must not return it twice.
	m.mounted, m.added = false, 0
	m.Dir = ""
	// A live owner's mount is left alone.
	live, err := NewMount(t.TempDir(), 1)
	if err != nil {
		t.Fatalf("second mount: %v", err)
	}
	defer live.Close()
	if swept, err := SweepStale(); err != nil || slices.Contains(swept, live.Dir) {
		t.Fatalf("SweepStale swept a live mount: %v, %v", swept, err)
	}
}

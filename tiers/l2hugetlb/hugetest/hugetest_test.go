package hugetest

import (
	"os"
	"testing"

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

package hugetest

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSetup checks that Setup hands out a usable backing and, for
// hugetlbfs, that the mount reports its reserved pages through statfs and
// that the pool returns to its size after cleanup.
func TestSetup(t *testing.T) {
	before, _ := readPool()
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
	if after, err := readPool(); err == nil && after != before {
		t.Fatalf("nr_hugepages %d after cleanup, was %d", after, before)
	}
}

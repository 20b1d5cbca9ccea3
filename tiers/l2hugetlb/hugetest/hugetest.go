// Package hugetest sets up real hugetlbfs for the L2 slab's tests and
// benchmarks: it reserves 2 MiB hugepages (writing the kernel's
// nr_hugepages), mounts hugetlbfs in a temporary directory with exactly
// those pages reserved for it, and undoes both afterwards. Where the kernel
// refuses (not root, no hugetlbfs, memory too fragmented) it says why, and
// Setup falls back to a private directory on /dev/shm so the same tests run
// on the shm backing.
//
// It changes a machine-wide kernel setting, so it must never be used by
// production code paths: only tests, `kvtier bench l2` and other tools that
// set up a throwaway slab. It changes nr_hugepages only by the pages it
// added, under a machine-wide file lock, so concurrent users (other test
// binaries) do not undo each other.
package hugetest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// PageSize is the hugepage size hugetest reserves and mounts: 2 MiB.
const PageSize = 2 << 20

// Backing names, as in tiers.SlabGeometry.Backing.
const (
	// BackingHugetlbfs: files on a hugetlbfs mount, 2 MiB pages.
	BackingHugetlbfs = "hugetlbfs"
	// BackingShm: files on a tmpfs (the explicit fallback), system pages.
	BackingShm = "shm"
)

// nrPath is the 2 MiB pool's size knob (the same pool as
// /proc/sys/vm/nr_hugepages on x86-64, but explicit about the page size).
const nrPath = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"

// Mount is a hugetlbfs mount with pages reserved for it.
type Mount struct {
	// Dir is the mount point.
	Dir string
	// Pages is the number of 2 MiB pages reserved for the mount (its size).
	Pages int

	added   int
	mounted bool
}

// lockPool serialises read-modify-writes of nr_hugepages across processes.
func lockPool() (func(), error) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "kvtier-hugepages.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("hugepage pool lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("hugepage pool lock %s: %w", f.Name(), err)
	}
	return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
}

func readPool() (int, error) {
	b, err := os.ReadFile(nrPath)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", nrPath, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", nrPath, err)
	}
	return n, nil
}

func writePool(n int) error {
	if err := os.WriteFile(nrPath, []byte(strconv.Itoa(n)), 0o644); err != nil {
		return fmt.Errorf("write %d to %s: %w", n, nrPath, err)
	}
	return nil
}

// adjustPool adds delta pages to the pool and returns how many the kernel
// actually added (it may grant fewer when memory is fragmented).
func adjustPool(delta int) (int, error) {
	unlock, err := lockPool()
	if err != nil {
		return 0, err
	}
	defer unlock()
	before, err := readPool()
	if err != nil {
		return 0, err
	}
	target := max(0, before+delta)
	if err := writePool(target); err != nil {
		return 0, err
	}
	after, err := readPool()
	if err != nil {
		return 0, err
	}
	return after - before, nil
}

// mountPrefix starts the name of every mount point hugetest makes; the
// owner's pid follows, so a later run can tell a mount whose owner died
// (a SIGKILLed test binary never runs its cleanup) from a live one.
const mountPrefix = "hugetlbfs-kvtier-"

// NewMount reserves pages 2 MiB hugepages and mounts hugetlbfs on a new
// directory under parent, with size and min_size both set to those pages
// so that the mount's statfs reports them and no other user can take them.
// It needs root. On error nothing is left reserved or mounted. First it
// sweeps mounts left by hugetest users that died without cleaning up
// (SweepStale), so killed runs do not leak hugepages across runs.
func NewMount(parent string, pages int) (*Mount, error) {
	return newMount(parent, pages, os.Getpid())
}

func newMount(parent string, pages, owner int) (*Mount, error) {
	if pages < 1 {
		return nil, fmt.Errorf("hugetlbfs mount: %d pages, want at least 1", pages)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("hugetlbfs mount: not root (reserving hugepages and mounting need it)")
	}
	if _, err := SweepStale(); err != nil {
		return nil, fmt.Errorf("hugetlbfs mount: %w", err)
	}
	added, err := adjustPool(pages)
	if err != nil {
		return nil, fmt.Errorf("hugetlbfs mount: reserve %d hugepages: %w", pages, err)
	}
	m := &Mount{Pages: pages, added: added}
	if added < pages {
		err := fmt.Errorf("hugetlbfs mount: the kernel granted %d of %d 2 MiB hugepages (memory too fragmented or limited)", added, pages)
		return nil, errors.Join(err, m.Close())
	}
	dir, err := os.MkdirTemp(parent, fmt.Sprintf("%s%d-", mountPrefix, owner))
	if err != nil {
		return nil, errors.Join(fmt.Errorf("hugetlbfs mount: %w", err), m.Close())
	}
	m.Dir = dir
	opts := fmt.Sprintf("pagesize=2M,size=%d,min_size=%d", int64(pages)*PageSize, int64(pages)*PageSize)
	if err := unix.Mount("none", dir, "hugetlbfs", 0, opts); err != nil {
		return nil, errors.Join(fmt.Errorf("hugetlbfs mount: mount -t hugetlbfs -o %s none %s: %w", opts, dir, err), m.Close())
	}
	m.mounted = true
	return m, nil
}

// SweepStale unmounts every hugetlbfs mount that hugetest made for a
// process that no longer exists, removes its mount point and returns its
// pages to the pool, under the pool lock. It returns the mount points it
// removed. A mount whose owner pid is alive (or was reused by another
// process) is left alone: sweeping errs on the side of leaking.
func SweepStale() ([]string, error) {
	mounts, err := procfs.GetMounts()
	if err != nil {
		return nil, fmt.Errorf("sweep stale hugetlbfs mounts: %w", err)
	}
	unlock, err := lockPool()
	if err != nil {
		return nil, err
	}
	defer unlock()
	var swept []string
	var errs []error
	for _, m := range mounts {
		dir, pages, owner, ok := staleCandidate(m)
		if !ok || unix.Kill(owner, 0) != unix.ESRCH {
			continue
		}
		if err := unix.Unmount(dir, 0); err != nil {
			errs = append(errs, fmt.Errorf("unmount stale hugetlbfs %s (owner pid %d gone): %w", dir, owner, err))
			continue
		}
		_ = os.Remove(dir)
		n, err := readPool()
		if err == nil {
			err = writePool(max(0, n-pages))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("return %d hugepages of stale mount %s: %w", pages, dir, err))
		}
		swept = append(swept, dir)
	}
	return swept, errors.Join(errs...)
}

// staleCandidate reports whether a mount of /proc/self/mountinfo is a
// hugetlbfs mount made by hugetest, and then its mount point, its reserved
// pages (the min_size superblock option) and its owner's pid.
func staleCandidate(m *procfs.MountInfo) (dir string, pages, owner int, ok bool) {
	if m.FSType != "hugetlbfs" {
		return "", 0, 0, false
	}
	dir = m.MountPoint
	name := filepath.Base(dir)
	if !strings.HasPrefix(name, mountPrefix) {
		return "", 0, 0, false
	}
	pidText, _, found := strings.Cut(strings.TrimPrefix(name, mountPrefix), "-")
	owner, err := strconv.Atoi(pidText)
	if !found || err != nil || owner <= 0 {
		return "", 0, 0, false
	}
	v, found := m.SuperOptions["min_size"]
	if !found {
		return "", 0, 0, false
	}
	size, err := strconv.ParseInt(v, 10, 64)
	if err != nil || size <= 0 || size%PageSize != 0 {
		return "", 0, 0, false
	}
	return dir, int(size / PageSize), owner, true
}

// Close unmounts (the files on the mount go with it) and returns the pages
// it added to the pool. Mappings of files on the mount must be gone first.
func (m *Mount) Close() error {
	var errs []error
	if m.mounted {
		if err := unix.Unmount(m.Dir, 0); err != nil {
			errs = append(errs, fmt.Errorf("unmount hugetlbfs %s: %w", m.Dir, err))
		} else {
			m.mounted = false
		}
	}
	if m.Dir != "" && !m.mounted {
		if err := os.Remove(m.Dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove mount point: %w", err))
		}
	}
	if m.added > 0 && !m.mounted {
		if _, err := adjustPool(-m.added); err != nil {
			errs = append(errs, fmt.Errorf("return %d hugepages: %w", m.added, err))
		} else {
			m.added = 0
		}
	}
	return errors.Join(errs...)
}

// TB is the part of testing.TB that Setup uses.
type TB interface {
	Helper()
	Logf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	TempDir() string
}

// Backing is where a test's slab files go.
type Backing struct {
	// Kind is BackingHugetlbfs or BackingShm.
	Kind string
	// Dir is the hugetlbfs mount point, or a private directory on
	// /dev/shm for the shm fallback.
	Dir string
	// Pages is the number of hugepages reserved (0 for shm).
	Pages int
	// Why says why the backing is shm, empty for hugetlbfs.
	Why string
}

// Setup gives a test a hugetlbfs mount with pages 2 MiB pages, unmounted
// and returned at the test's cleanup. Where the kernel refuses, it logs why
// and returns a private /dev/shm directory instead (Kind BackingShm).
// KVTIER_L2_FORCE_SHM=1 in the environment skips the hugetlbfs attempt.
func Setup(t TB, pages int) Backing {
	t.Helper()
	why := "KVTIER_L2_FORCE_SHM is set"
	if os.Getenv("KVTIER_L2_FORCE_SHM") != "1" {
		m, err := NewMount(t.TempDir(), pages)
		if err == nil {
			t.Cleanup(func() {
				if err := m.Close(); err != nil {
					t.Logf("hugetest cleanup: %v", err)
				}
			})
			t.Logf("L2 backing: hugetlbfs, %d x 2 MiB pages mounted at %s", pages, m.Dir)
			return Backing{Kind: BackingHugetlbfs, Dir: m.Dir, Pages: pages}
		}
		why = err.Error()
	}
	t.Logf("L2 backing: shm fallback (hugetlbfs refused: %s)", why)
	return Backing{Kind: BackingShm, Dir: ShmDir(t), Why: why}
}

// ShmDir returns a private directory on /dev/shm removed at the test's
// cleanup (a temp dir when /dev/shm is missing).
func ShmDir(t TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "kvtier-test-")
	if err != nil {
		t.Logf("no /dev/shm (%v); using a temp dir", err)
		return t.TempDir()
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

package l2hugetlb

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/quantity"
)

// backingInfo is what statfs says about a directory.
type backingInfo struct {
	kind     string // BackingHugetlbfs or BackingShm
	pageSize int64
	// freePages is the number of free backing pages; limited says whether
	// it comes from the mount's own size limit (else from the pool).
	freePages int64
	limited   bool
	// poolPages is the kernel's hugepage pool size for the page size (for
	// the "echo N > nr_hugepages" advice); 0 for shm.
	poolPages int64
}

// probeHugetlbfs statfs-es dir and reports its page size and free pages.
// It fails if dir is missing or not hugetlbfs.
func probeHugetlbfs(dir string) (backingInfo, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return backingInfo{}, fmt.Errorf("statfs %s: %w", dir, err)
	}
	if st.Type != unix.HUGETLBFS_MAGIC {
		return backingInfo{}, fmt.Errorf("%s is not a hugetlbfs mount (filesystem type %#x)", dir, st.Type)
	}
	info := backingInfo{kind: BackingHugetlbfs, pageSize: st.Bsize}
	pool := PoolDir(st.Bsize)
	info.poolPages, _ = readInt(filepath.Join(pool, "nr_hugepages"))
	if st.Blocks > 0 {
		// A mount with size= reports its own limit: block size = hugepage
		// size, available blocks = free hugepages of the mount. (If the
		// pool cannot back them, mmap fails with ENOMEM, which Open reports
		// as a capacity error too.)
		info.freePages, info.limited = int64(st.Bavail), true
		return info, nil
	}
	// No size limit: statfs reports 0 blocks; the free pages are the
	// pool's, less those already promised to other mappings.
	free, err := poolFree(pool)
	if err != nil {
		return backingInfo{}, fmt.Errorf("free hugepages of %s: %w", dir, err)
	}
	info.freePages = free
	return info, nil
}

// PoolDir returns the sysfs directory of the kernel's pool of pageSize
// hugepages, whose nr_hugepages, free_hugepages and resv_hugepages files
// hold one count each (ParseCount). prometheus/procfs reads /proc/meminfo's
// figures for the default size only, so the pools of other sizes are read
// here, for this package and for kvtier doctor.
func PoolDir(pageSize int64) string {
	return fmt.Sprintf("/sys/kernel/mm/hugepages/hugepages-%dkB", pageSize>>10)
}

func poolFree(pool string) (int64, error) {
	free, err := readInt(filepath.Join(pool, "free_hugepages"))
	if err != nil {
		return 0, err
	}
	rsvd, err := readInt(filepath.Join(pool, "resv_hugepages"))
	if err != nil {
		return 0, err
	}
	return max(0, free-rsvd), nil
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := ParseCount(b)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

// ParseCount reads a file holding one non-negative integer: a hugepage
// pool's counters (PoolDir) or /proc/sys/vm/nr_hugepages.
func ParseCount(b []byte) (int64, error) {
	s := strings.TrimSpace(string(b))
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		if len(s) > 32 {
			s = s[:32] + "..."
		}
		return 0, fmt.Errorf("want a non-negative count, got %q", s)
	}
	return v, nil
}

// probeShm statfs-es a tmpfs directory.
func probeShm(dir string) (backingInfo, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return backingInfo{}, fmt.Errorf("statfs %s: %w", dir, err)
	}
	page := int64(os.Getpagesize())
	return backingInfo{kind: BackingShm, pageSize: page, freePages: int64(st.Bavail) * st.Bsize / page, limited: true}, nil
}

// checkCapacity returns nil if needBytes fit in the backing's free pages,
// else an ErrCapacity error with what to do about it.
func checkCapacity(dir string, info backingInfo, needBytes int64) error {
	needPages := needBytes / info.pageSize
	if needPages <= info.freePages {
		return nil
	}
	if info.kind == BackingShm {
		return fmt.Errorf("need %s on %s but only %s free; free memory there or reduce size: %w",
			quantity.Size(needBytes), dir, quantity.Size(info.freePages*info.pageSize), ErrCapacity)
	}
	advice := fmt.Sprintf("reserve more (echo %d > %s) or reduce size",
		info.poolPages+needPages-info.freePages, poolKnob(info.pageSize))
	if info.limited {
		advice = fmt.Sprintf("raise the mount's size= limit and reserve more (echo %d > %s), or reduce size",
			info.poolPages+needPages-info.freePages, poolKnob(info.pageSize))
	}
	return fmt.Errorf("need %s (%d x %s pages) on %s but only %s free; %s: %w",
		quantity.Size(needBytes), needPages, quantity.Size(info.pageSize), dir, quantity.Size(info.freePages*info.pageSize), advice, ErrCapacity)
}

func poolKnob(pageSize int64) string {
	if pageSize == 2<<20 {
		return "/proc/sys/vm/nr_hugepages"
	}
	return filepath.Join(PoolDir(pageSize), "nr_hugepages")
}

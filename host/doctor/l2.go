package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/tiers/l2hugetlb"
)

// hugePage is the page size kvtier's slab expects of its hugetlbfs mount.
const hugePage = 2 << 20

// Paths of the kernel's hugepage counters.
const (
	procNrHugepages = "/proc/sys/vm/nr_hugepages"
	procMeminfo     = "/proc/meminfo"
)

// slabTier returns the stack's l2hugetlb tier and its config, or ok false.
func slabTier(st *config.Stack) (t config.Tier, c l2hugetlb.Config, ok bool) {
	for _, t := range st.Tiers {
		if t.Role != config.RoleSlab || t.Use != l2hugetlb.Name {
			continue
		}
		switch v := t.Config.(type) {
		case *l2hugetlb.Config:
			if v != nil {
				return t, *v, true
			}
		case l2hugetlb.Config:
			return t, v, true
		}
		return t, l2hugetlb.DefaultConfig(), true
	}
	return config.Tier{}, l2hugetlb.Config{}, false
}

// noSlab is the result of the L2 checks for a stack without an l2hugetlb
// slab.
func noSlab(st *config.Stack) Result {
	for _, t := range st.Tiers {
		if t.Role == config.RoleSlab {
			return passf("the slab tier %q is not l2hugetlb; nothing to check", t.Name)
		}
	}
	return passf("the stack has no slab tier; nothing to check")
}

// hugepagePool is the kernel's pool of one hugepage size.
type hugepagePool struct {
	pageSize          int64
	total, free, rsvd int64
	// knob is the file to write the pool size to.
	knob string
}

// readPool reads the pool of pageSize hugepages: /proc/sys/vm/nr_hugepages
// and /proc/meminfo when pageSize is the default hugepage size, else the
// pool's sysfs directory.
func readPool(sys System, pageSize int64) (hugepagePool, error) {
	raw, err := sys.Meminfo()
	if err != nil {
		return hugepagePool{}, fmt.Errorf("read %s: %w", procMeminfo, err)
	}
	mi, err := hugeMeminfo(raw)
	if err != nil {
		return hugepagePool{}, fmt.Errorf("%s: %w", procMeminfo, err)
	}
	if mi.hugepageSize == pageSize {
		p := hugepagePool{pageSize: pageSize, total: mi.hugeTotal, free: mi.hugeFree, rsvd: mi.hugeRsvd, knob: procNrHugepages}
		// nr_hugepages is what an operator sets; HugePages_Total lags it
		// while the kernel is still finding pages, so report the setting.
		if b, err := sys.ReadFile(procNrHugepages); err == nil {
			if n, err := l2hugetlb.ParseCount(b); err == nil {
				p.total = n
			}
		}
		return p, nil
	}
	dir := l2hugetlb.PoolDir(pageSize)
	p := hugepagePool{pageSize: pageSize, knob: filepath.Join(dir, "nr_hugepages")}
	for _, f := range []struct {
		name string
		dst  *int64
	}{{"nr_hugepages", &p.total}, {"free_hugepages", &p.free}, {"resv_hugepages", &p.rsvd}} {
		b, err := sys.ReadFile(filepath.Join(dir, f.name))
		if err != nil {
			return hugepagePool{}, fmt.Errorf("read %s: %w", filepath.Join(dir, f.name), err)
		}
		if *f.dst, err = l2hugetlb.ParseCount(b); err != nil {
			return hugepagePool{}, fmt.Errorf("%s: %w", filepath.Join(dir, f.name), err)
		}
	}
	return p, nil
}

// mountInfo is what statfs says about the slab's mount, if it is one.
type mountInfo struct {
	st        FSStat
	err       error
	hugetlbfs bool
}

func statMount(sys System, dir string) mountInfo {
	st, err := sys.Statfs(dir)
	if err != nil {
		return mountInfo{err: err}
	}
	return mountInfo{st: st, hugetlbfs: st.Type == unix.HUGETLBFS_MAGIC}
}

// checkHugepages compares the free hugepages with the slab size.
func checkHugepages(_ context.Context, e *env) Result {
	t, c, ok := slabTier(e.st)
	if !ok {
		return noSlab(e.st)
	}
	size := int64(c.Size)
	m := statMount(e.sys, c.Mount)
	pageSize := int64(hugePage)
	if m.hugetlbfs && m.st.BlockSize > 0 {
		pageSize = m.st.BlockSize
	}
	need := (size + pageSize - 1) / pageSize
	detail := map[string]any{"tier": t.Name, "slab_bytes": size, "page_bytes": pageSize, "need_pages": need}
	pool, err := readPool(e.sys, pageSize)
	if err != nil {
		return failf("cannot read the hugepage pool: %v", err).with(detail)
	}
	avail := max(0, pool.free-pool.rsvd)
	detail["nr_hugepages"], detail["free_pages"], detail["reserved_pages"] = pool.total, pool.free, pool.rsvd
	limit := ""
	if m.hugetlbfs && m.st.Blocks > 0 {
		// A mount with size= caps what the slab may take, whatever the pool
		// holds.
		detail["mount_free_pages"] = m.st.Avail
		if int64(m.st.Avail) < avail {
			avail = int64(m.st.Avail)
			limit = fmt.Sprintf(" (the size= limit of %s)", c.Mount)
		}
	}
	detail["available_pages"] = avail
	if avail >= need {
		return passf("%d x %s hugepages free%s, the %s slab needs %d", avail, human(pageSize), limit, human(size), need).with(detail)
	}
	advice := fmt.Sprintf("reserve more: echo %d > %s (persist it with vm.nr_hugepages in /etc/sysctl.d or hugepages= on the kernel command line)",
		pool.total+need-avail, pool.knob)
	if limit != "" {
		advice = fmt.Sprintf("raise the size= limit of %s (mount -o remount,size=%dM %s) and reserve more (echo %d > %s)",
			c.Mount, need*pageSize>>20, c.Mount, pool.total+need-avail, pool.knob)
	}
	short := fmt.Sprintf("the %s slab needs %d x %s hugepages, %d free%s", human(size), need, human(pageSize), avail, limit)
	if c.Fallback != l2hugetlb.FallbackShm {
		return failf("%s; %s, or reduce $.tiers[%s].config.size", short, advice, t.Name).with(detail)
	}
	// The shm fallback will take the slab: does it fit there?
	shm, err := e.sys.Statfs(c.ShmDir)
	if err != nil {
		return failf("%s, and the shm fallback directory %s cannot be read (%v); %s", short, c.ShmDir, err, advice).with(detail)
	}
	shmFree := int64(shm.Avail) * shm.BlockSize
	detail["shm_dir"], detail["shm_free_bytes"] = c.ShmDir, shmFree
	if shmFree < size {
		return failf("%s, and the shm fallback %s has only %s free; %s, or free memory in %s, or reduce the slab size",
			short, c.ShmDir, human(shmFree), advice, c.ShmDir).with(detail)
	}
	return warnf("%s: serve will fall back to %s (not hugepage-backed: more TLB misses, and the pages can be swapped unless mlock: true); %s",
		short, c.ShmDir, advice).with(detail)
}

// checkHugetlbfsMount checks the slab's mount point.
func checkHugetlbfsMount(_ context.Context, e *env) Result {
	t, c, ok := slabTier(e.st)
	if !ok {
		return noSlab(e.st)
	}
	detail := map[string]any{"tier": t.Name, "mount": c.Mount, "fallback": string(c.Fallback)}
	mount := fmt.Sprintf("mkdir -p %s && mount -t hugetlbfs -o pagesize=2M none %s (or an /etc/fstab line)", c.Mount, c.Mount)
	bad := failf
	consequence := "serve will refuse to open the slab (fallback: none)"
	if c.Fallback == l2hugetlb.FallbackShm {
		bad = warnf
		consequence = fmt.Sprintf("serve will fall back to %s, not hugepage-backed", c.ShmDir)
	}
	m := statMount(e.sys, c.Mount)
	switch {
	case errors.Is(m.err, fs.ErrNotExist):
		return bad("%s does not exist: %s; mount it: %s", c.Mount, consequence, mount).with(detail)
	case m.err != nil:
		return bad("%s cannot be read (%v): %s", c.Mount, m.err, consequence).with(detail)
	case !m.hugetlbfs:
		detail["fs_type"] = fmt.Sprintf("%#x", m.st.Type)
		return bad("%s is not a hugetlbfs mount (file system type %#x): %s; mount it: %s", c.Mount, m.st.Type, consequence, mount).with(detail)
	}
	detail["page_bytes"] = m.st.BlockSize
	if err := e.sys.Access(c.Mount, AccessWrite); err != nil {
		return failf("%s is hugetlbfs but this user cannot create files in it (%v): run serve as a user who can, or mount it with uid=/gid=/mode= for that user", c.Mount, err).with(detail)
	}
	if m.st.BlockSize != hugePage {
		return warnf("%s is hugetlbfs with %s pages, kvtier expects 2 MiB pages (the slab rounds to whole pages and registers with the GPU in them): remount with -o pagesize=2M", c.Mount, human(m.st.BlockSize)).with(detail)
	}
	return passf("%s is hugetlbfs with 2 MiB pages, writable", c.Mount).with(detail)
}

// cudaPool is the registered name of l1cuda's CUDA pool, the one pool
// that page-locks the slab in this process.
const cudaPool = "cuda"

// capIPCLock is CAP_IPC_LOCK's bit in /proc/self/status CapEff: a process
// holding it may lock memory beyond RLIMIT_MEMLOCK.
const capIPCLock = 14

// checkMemlock compares RLIMIT_MEMLOCK with the bytes this stack pins:
// the slab when it is mlocked or when a cuda pool registers it with the
// driver (cudaHostRegister page-locks it).
func checkMemlock(_ context.Context, e *env) Result {
	limit, err := e.sys.MemlockLimit()
	if err != nil {
		return failf("cannot read the memlock limit: %v", err)
	}
	detail := map[string]any{}
	if limit == unix.RLIM_INFINITY {
		detail["limit"] = "unlimited"
	} else {
		detail["limit_bytes"] = limit
	}
	var pin int64
	var why []string
	hard := false // a pin that fails for sure (mlock), not only may (cudaHostRegister)
	if t, c, ok := slabTier(e.st); ok {
		size := (int64(c.Size) + hugePage - 1) / hugePage * hugePage
		if c.Mlock {
			pin, hard = size, true
			why = append(why, fmt.Sprintf("slab %q has mlock: true", t.Name))
		}
		for _, p := range e.st.Tiers {
			if p.Role == config.RolePool && p.Use == cudaPool {
				pin = size
				why = append(why, fmt.Sprintf("cuda pool %q registers the slab with cudaHostRegister", p.Name))
			}
		}
	}
	detail["pin_bytes"] = pin
	if pin == 0 {
		return passf("nothing in this stack pins memory (no mlock: true slab, no cuda pool); memlock limit %s", limitString(limit)).with(detail)
	}
	if limit == unix.RLIM_INFINITY || uint64(pin) <= limit {
		return passf("memlock limit %s covers the %s this stack pins (%s)", limitString(limit), human(pin), strings.Join(why, ", ")).with(detail)
	}
	if st, err := e.sys.SelfStatus(); err == nil && st.CapEff&(1<<capIPCLock) != 0 {
		detail["cap_ipc_lock"] = true
		return passf("memlock limit %s is below the %s this stack pins (%s), but this process holds CAP_IPC_LOCK, which lifts the limit: run serve with the same capability", limitString(limit), human(pin), strings.Join(why, ", ")).with(detail)
	}
	advice := "raise it: ulimit -l unlimited in the shell that starts serve, LimitMEMLOCK=infinity in its systemd unit, a memlock line in /etc/security/limits.conf, or --ulimit memlock=-1 for a container"
	if !hard {
		return warnf("memlock limit %s is below the %s the cuda pool pins (%s); some drivers refuse cudaHostRegister past it: %s", limitString(limit), human(pin), strings.Join(why, ", "), advice).with(detail)
	}
	return failf("memlock limit %s is below the %s this stack pins (%s): serve will fail to mlock the slab; %s, or set mlock: false", limitString(limit), human(pin), strings.Join(why, ", "), advice).with(detail)
}

func limitString(l uint64) string {
	if l == unix.RLIM_INFINITY {
		return "unlimited"
	}
	return human(int64(min(l, 1<<62)))
}

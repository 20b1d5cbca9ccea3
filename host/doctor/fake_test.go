package doctor

import (
	"fmt"
	"io/fs"
	"path"
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/tiers/l3disk"
)

// fakeInfo is a fs.FileInfo of the fake machine.
type fakeInfo struct {
	name string
	mode fs.FileMode
	size int64
}

func (f fakeInfo) Name() string       { return f.name }
func (f fakeInfo) Size() int64        { return f.size }
func (f fakeInfo) Mode() fs.FileMode  { return f.mode }
func (f fakeInfo) ModTime() time.Time { return time.Time{} }
func (f fakeInfo) IsDir() bool        { return f.mode.IsDir() }
func (f fakeInfo) Sys() any           { return nil }

type plpAnswer struct {
	res l3disk.PLPResult
	err error
}

// fakeSys is a machine described by maps; what is absent does not exist.
type fakeSys struct {
	files      map[string]string
	meminfo    procfs.Meminfo
	meminfoErr error
	status     procfs.ProcStatus
	statfs     map[string]FSStat
	stats      map[string]fakeInfo
	noAccess   map[string]error
	memlock    uint64
	memlockErr error
	odirect    map[string]error
	plp        map[string]plpAnswer
	sums       map[string]string
	globs      map[string][]string
	// listening holds the unix sockets a live serve answers on.
	listening map[string]bool
	// calls records probe calls, "odirect DIR" and "plp DIR N".
	calls []string
}

var (
	_ System       = (*fakeSys)(nil)
	_ SocketDialer = (*fakeSys)(nil)
)

func (f *fakeSys) DialUnix(p string) error {
	if f.listening[p] {
		return nil
	}
	return &fs.PathError{Op: "dial", Path: p, Err: unix.ECONNREFUSED}
}

const (
	gib = int64(1) << 30
	mib = int64(1) << 20
)

// healthyMachine answers the default stack with a pass on every check.
func healthyMachine() *fakeSys {
	return &fakeSys{
		files: map[string]string{
			procNrHugepages: "4096\n",
		},
		meminfo: hugeMeminfoOf(4096, 4096, 0, 2048),
		statfs: map[string]FSStat{
			"/dev/hugepages":     {Type: unix.HUGETLBFS_MAGIC, BlockSize: 2 * mib, Device: 10},
			"/dev/shm":           {Type: unix.TMPFS_MAGIC, BlockSize: 4096, Blocks: uint64(64 * gib / 4096), Avail: uint64(64 * gib / 4096), Device: 11},
			"/var/tmp/kvtier/l3": {Type: unix.EXT4_SUPER_MAGIC, BlockSize: 4096, Blocks: uint64(1024 * gib / 4096), Avail: uint64(512 * gib / 4096), Device: 1},
		},
		stats: map[string]fakeInfo{
			"/":                  {name: "/", mode: fs.ModeDir | 0o755},
			"/var":               {name: "var", mode: fs.ModeDir | 0o755},
			"/var/tmp":           {name: "tmp", mode: fs.ModeDir | fs.ModeSticky | 0o777},
			"/var/tmp/kvtier":    {name: "kvtier", mode: fs.ModeDir | 0o755},
			"/var/tmp/kvtier/l3": {name: "l3", mode: fs.ModeDir | 0o755},
			"/dev/hugepages":     {name: "hugepages", mode: fs.ModeDir | 0o755},
		},
		memlock: 8 << 20,
		plp:     map[string]plpAnswer{},
		odirect: map[string]error{},
	}
}

func (f *fakeSys) ReadFile(p string) ([]byte, error) {
	s, ok := f.files[p]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	}
	return []byte(s), nil
}

func (f *fakeSys) Meminfo() (procfs.Meminfo, error) { return f.meminfo, f.meminfoErr }

func (f *fakeSys) SelfStatus() (procfs.ProcStatus, error) { return f.status, nil }

// hugeMeminfoOf is /proc/meminfo as procfs reads it, with the hugepage
// figures given and the default hugepage size in kB.
func hugeMeminfoOf(total, free, rsvd, sizeKB uint64) procfs.Meminfo {
	memTotal, surp, sizeBytes := uint64(263741236), uint64(0), sizeKB<<10
	return procfs.Meminfo{MemTotal: &memTotal, HugePagesTotal: &total, HugePagesFree: &free, HugePagesRsvd: &rsvd,
		HugePagesSurp: &surp, Hugepagesize: &sizeKB, HugepagesizeBytes: &sizeBytes}
}

func (f *fakeSys) Statfs(p string) (FSStat, error) {
	st, ok := f.statfs[p]
	if !ok {
		return FSStat{}, &fs.PathError{Op: "statfs", Path: p, Err: fs.ErrNotExist}
	}
	return st, nil
}

func (f *fakeSys) Stat(p string) (fs.FileInfo, error) {
	fi, ok := f.stats[p]
	if !ok {
		return nil, &fs.PathError{Op: "stat", Path: p, Err: fs.ErrNotExist}
	}
	return fi, nil
}

func (f *fakeSys) Access(p string, mode uint32) error {
	if err, ok := f.noAccess[p]; ok {
		return err
	}
	return nil
}

func (f *fakeSys) MemlockLimit() (uint64, error) { return f.memlock, f.memlockErr }

func (f *fakeSys) ProbeODirect(dir string) error {
	f.calls = append(f.calls, "odirect "+dir)
	return f.odirect[dir]
}

func (f *fakeSys) ProbePLP(dir string, probes int, oDirect string, maxSync time.Duration) (l3disk.PLPResult, error) {
	f.calls = append(f.calls, fmt.Sprintf("plp %s %d", dir, probes))
	a, ok := f.plp[dir]
	if !ok {
		med := 40 * time.Microsecond
		return l3disk.PLPResult{Probes: probes, Median: med, Max: 2 * med, Direct: oDirect != l3disk.ODirectOff, Protected: med <= maxSync}, nil
	}
	return a.res, a.err
}

func (f *fakeSys) FileSHA256(p string) (string, error) {
	s, ok := f.sums[p]
	if !ok {
		return "", &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	}
	return s, nil
}

func (f *fakeSys) Glob(pattern string) ([]string, error) {
	if _, err := path.Match(pattern, ""); err != nil {
		return nil, err
	}
	return f.globs[pattern], nil
}

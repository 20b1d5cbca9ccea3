package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/host/config"
	lmdbindex "github.com/kvtier/kvtier/indexes/lmdb"
	"github.com/kvtier/kvtier/tiers/l1cuda"
	"github.com/kvtier/kvtier/tiers/l2hugetlb"
	"github.com/kvtier/kvtier/tiers/l3disk"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
)

// defaultStack loads the embedded default stack with the built-in modules.
func defaultStack(t testing.TB) *config.Stack {
	t.Helper()
	var m config.Modules
	var err error
	if m.Tiers, err = builtin.Tiers(); err != nil {
		t.Fatal(err)
	}
	if m.Indexes, err = builtin.Indexes(); err != nil {
		t.Fatal(err)
	}
	if m.Policies, err = builtin.Policies(); err != nil {
		t.Fatal(err)
	}
	st, err := config.Default(m)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func l2Of(st *config.Stack) *l2hugetlb.Config {
	for _, t := range st.Tiers {
		if c, ok := t.Config.(*l2hugetlb.Config); ok {
			return c
		}
	}
	panic("default stack has no l2hugetlb tier")
}

func l3Of(st *config.Stack) *l3disk.Config {
	for _, t := range st.Tiers {
		if c, ok := t.Config.(*l3disk.Config); ok {
			return c
		}
	}
	panic("default stack has no l3disk tier")
}

func lmdbOf(st *config.Stack) *lmdbindex.Config {
	for i, t := range st.Tiers {
		if t.Index != nil && t.Index.Use == lmdbindex.Name {
			c, ok := t.Index.Config.(*lmdbindex.Config)
			if !ok {
				d := lmdbindex.DefaultConfig()
				c = &d
				st.Tiers[i].Index.Config = c
			}
			return c
		}
	}
	panic("default stack has no lmdb index")
}

const (
	goodSum  = "1111111111111111111111111111111111111111111111111111111111111111"
	otherSum = "2222222222222222222222222222222222222222222222222222222222222222"
	l3dir    = "/var/tmp/kvtier/l3"
)

func withPlugin(st *config.Stack) {
	st.Tiers = append(st.Tiers, config.Tier{Name: "remote", Role: config.RoleStore,
		Plugin: &config.PluginSpec{Path: "/opt/kvtier/plugin-remote", SHA256: strings.ToUpper(goodSum)}})
}

func pluginBinary(f *fakeSys) {
	f.stats["/opt/kvtier/plugin-remote"] = fakeInfo{name: "plugin-remote", mode: 0o755, size: 1 << 20}
	f.sums = map[string]string{"/opt/kvtier/plugin-remote": goodSum}
}

func TestChecks(t *testing.T) {
	type tc struct {
		name  string
		check string
		stack func(*config.Stack)
		sys   func(*fakeSys)
		want  Status
		msg   []string // substrings of the message
		calls []string // probe calls, when checked
	}
	tests := []tc{
		// hugepages: the default slab is 4 GiB = 2048 pages.
		{name: "enough", check: CheckHugepages, want: Pass, msg: []string{"4096 x 2.00 MiB hugepages free", "needs 2048"}},
		{name: "short without fallback", check: CheckHugepages,
			stack: func(s *config.Stack) { l2Of(s).Fallback = l2hugetlb.FallbackNone },
			sys: func(f *fakeSys) {
				f.meminfo = hugeMeminfoOf(100, 100, 0, 2048)
				f.files[procNrHugepages] = "100\n"
			},
			want: Fail, msg: []string{"needs 2048 x 2.00 MiB hugepages, 100 free", "echo 2048 > /proc/sys/vm/nr_hugepages", "reduce $.tiers[l2].config.size"}},
		{name: "reserved pages are not free", check: CheckHugepages,
			stack: func(s *config.Stack) { l2Of(s).Fallback = l2hugetlb.FallbackNone },
			sys:   func(f *fakeSys) { f.meminfo = hugeMeminfoOf(4096, 4096, 3000, 2048) },
			want:  Fail, msg: []string{"1096 free", "echo 5048 >"}},
		{name: "short with shm fallback", check: CheckHugepages,
			sys:  func(f *fakeSys) { f.meminfo = hugeMeminfoOf(0, 0, 0, 2048); f.files[procNrHugepages] = "0\n" },
			want: Warn, msg: []string{"fall back to /dev/shm", "echo 2048 > /proc/sys/vm/nr_hugepages"}},
		{name: "short and shm too small", check: CheckHugepages,
			sys: func(f *fakeSys) {
				f.meminfo = hugeMeminfoOf(0, 0, 0, 2048)
				f.statfs["/dev/shm"] = FSStat{Type: unix.TMPFS_MAGIC, BlockSize: 4096, Blocks: 1 << 20, Avail: 1000}
			},
			want: Fail, msg: []string{"shm fallback /dev/shm has only 3.91 MiB free"}},
		{name: "mount size limit", check: CheckHugepages,
			stack: func(s *config.Stack) { l2Of(s).Fallback = l2hugetlb.FallbackNone },
			sys: func(f *fakeSys) {
				f.statfs["/dev/hugepages"] = FSStat{Type: unix.HUGETLBFS_MAGIC, BlockSize: 2 * mib, Blocks: 512, Avail: 512}
			},
			want: Fail, msg: []string{"512 free (the size= limit of /dev/hugepages)", "mount -o remount,size=4096M /dev/hugepages"}},
		{name: "default hugepage size is 1 GiB: the 2 MiB pool from sysfs", check: CheckHugepages,
			sys: func(f *fakeSys) {
				f.meminfo = hugeMeminfoOf(8, 8, 0, 1<<20)
				d := "/sys/kernel/mm/hugepages/hugepages-2048kB/"
				f.files[d+"nr_hugepages"], f.files[d+"free_hugepages"], f.files[d+"resv_hugepages"] = "3000", "2999", "1"
			},
			want: Pass, msg: []string{"2998 x 2.00 MiB hugepages free"}},
		{name: "meminfo unreadable", check: CheckHugepages,
			sys:  func(f *fakeSys) { f.meminfoErr = &fs.PathError{Op: "open", Path: procMeminfo, Err: fs.ErrNotExist} },
			want: Fail, msg: []string{"cannot read the hugepage pool", procMeminfo}},
		{name: "meminfo without hugetlb", check: CheckHugepages,
			sys:  func(f *fakeSys) { f.meminfo.HugePagesRsvd = nil },
			want: Fail, msg: []string{"no HugePages_Rsvd line"}},
		{name: "meminfo garbled", check: CheckHugepages,
			sys: func(f *fakeSys) {
				n := uint64(1 << 60)
				f.meminfo.HugePagesFree = &n
			},
			want: Fail, msg: []string{"HugePages_Free: 1152921504606846976 is not a count"}},
		{name: "no slab tier", check: CheckHugepages,
			stack: func(s *config.Stack) { s.Tiers = nil },
			want:  Pass, msg: []string{"no slab tier"}},

		// hugetlbfs_mount
		{name: "mounted", check: CheckHugetlbfsMount, want: Pass, msg: []string{"hugetlbfs with 2 MiB pages, writable"}},
		{name: "missing without fallback", check: CheckHugetlbfsMount,
			stack: func(s *config.Stack) { l2Of(s).Fallback = l2hugetlb.FallbackNone },
			sys:   func(f *fakeSys) { delete(f.statfs, "/dev/hugepages") },
			want:  Fail, msg: []string{"does not exist", "mount -t hugetlbfs -o pagesize=2M none /dev/hugepages"}},
		{name: "missing with shm fallback", check: CheckHugetlbfsMount,
			sys:  func(f *fakeSys) { delete(f.statfs, "/dev/hugepages") },
			want: Warn, msg: []string{"fall back to /dev/shm"}},
		{name: "not hugetlbfs", check: CheckHugetlbfsMount,
			stack: func(s *config.Stack) { l2Of(s).Fallback = l2hugetlb.FallbackNone },
			sys: func(f *fakeSys) {
				f.statfs["/dev/hugepages"] = FSStat{Type: unix.TMPFS_MAGIC, BlockSize: 4096}
			},
			want: Fail, msg: []string{"not a hugetlbfs mount (file system type 0x1021994)"}},
		{name: "1 GiB pages", check: CheckHugetlbfsMount,
			sys:  func(f *fakeSys) { f.statfs["/dev/hugepages"] = FSStat{Type: unix.HUGETLBFS_MAGIC, BlockSize: gib} },
			want: Warn, msg: []string{"1.00 GiB pages", "pagesize=2M"}},
		{name: "not writable", check: CheckHugetlbfsMount,
			sys:  func(f *fakeSys) { f.noAccess = map[string]error{"/dev/hugepages": fs.ErrPermission} },
			want: Fail, msg: []string{"cannot create files in it"}},

		// memlock
		{name: "nothing pinned", check: CheckMemlock, want: Pass, msg: []string{"nothing in this stack pins memory", "8.00 MiB"}},
		{name: "mlock under the limit", check: CheckMemlock,
			stack: func(s *config.Stack) { l2Of(s).Mlock = true },
			want:  Fail, msg: []string{"8.00 MiB is below the 4.00 GiB", "mlock: true", "ulimit -l unlimited", "LimitMEMLOCK=infinity"}},
		{name: "mlock unlimited", check: CheckMemlock,
			stack: func(s *config.Stack) { l2Of(s).Mlock = true },
			sys:   func(f *fakeSys) { f.memlock = unix.RLIM_INFINITY },
			want:  Pass, msg: []string{"memlock limit unlimited covers the 4.00 GiB"}},
		{name: "mlock with CAP_IPC_LOCK", check: CheckMemlock,
			stack: func(s *config.Stack) { l2Of(s).Mlock = true },
			sys:   func(f *fakeSys) { f.status.CapEff = 0x000001ffffffffff },
			want:  Pass, msg: []string{"CAP_IPC_LOCK"}},
		{name: "cuda pool under the limit", check: CheckMemlock,
			stack: func(s *config.Stack) {
				s.Tiers = append([]config.Tier{{Name: "l1", Role: config.RolePool, Use: "cuda", Config: &l1cuda.CUDAConfig{}}}, s.Tiers...)
			},
			want: Warn, msg: []string{"cuda pool \"l1\" registers the slab", "cudaHostRegister"}},
		{name: "limit unreadable", check: CheckMemlock,
			sys:  func(f *fakeSys) { f.memlockErr = errors.New("getrlimit: EPERM") },
			want: Fail, msg: []string{"cannot read the memlock limit"}},

		// o_direct
		{name: "o_direct ok", check: CheckODirect, want: Pass, msg: []string{"O_DIRECT 4 KiB write ok"}, calls: []string{"odirect " + l3dir}},
		{name: "o_direct refused, auto", check: CheckODirect,
			sys:  func(f *fakeSys) { f.odirect[l3dir] = fmt.Errorf("open x: %w", diskfs.ErrDirectRefused) },
			want: Warn, msg: []string{"refuses O_DIRECT", "falls back to buffered I/O"}},
		{name: "o_direct refused, on", check: CheckODirect,
			stack: func(s *config.Stack) { l3Of(s).ODirect = l3disk.ODirectOn },
			sys:   func(f *fakeSys) { f.odirect[l3dir] = fmt.Errorf("open x: %w", diskfs.ErrDirectRefused) },
			want:  Fail, msg: []string{"o_direct: on", "set o_direct: auto"}},
		{name: "o_direct off is not probed", check: CheckODirect,
			stack: func(s *config.Stack) { l3Of(s).ODirect = l3disk.ODirectOff },
			want:  Pass, msg: []string{"not probed"}, calls: []string{}},
		{name: "missing dir probes its ancestor", check: CheckODirect,
			sys:  func(f *fakeSys) { delete(f.stats, l3dir); delete(f.stats, "/var/tmp/kvtier") },
			want: Pass, msg: []string{"absent; serve creates it; probed /var/tmp"}, calls: []string{"odirect /var/tmp"}},
		{name: "dir is a file", check: CheckODirect,
			sys:  func(f *fakeSys) { f.stats[l3dir] = fakeInfo{name: "l3", mode: 0o644} },
			want: Fail, msg: []string{"is not a directory", "disks[0].dir"}, calls: []string{}},
		{name: "permission denied", check: CheckODirect,
			sys:  func(f *fakeSys) { f.odirect[l3dir] = fmt.Errorf("open x: %w", fs.ErrPermission) },
			want: Fail, msg: []string{"cannot write a scratch file", "chown"}},

		// plp
		{name: "protected", check: CheckPLP, want: Pass, msg: []string{"median 40µs (limit 500µs): power-loss protected"}, calls: []string{"plp " + l3dir + " 8"}},
		{name: "slow sync warns", check: CheckPLP,
			sys: func(f *fakeSys) {
				f.plp[l3dir] = plpAnswer{res: l3disk.PLPResult{Probes: 8, Median: 3 * time.Millisecond, Max: 5 * time.Millisecond}}
			},
			want: Warn, msg: []string{"median 3ms, above plp_max_sync 500µs", "datacenter SSD"}},
		{name: "slow sync with require_plp fails", check: CheckPLP,
			stack: func(s *config.Stack) { l3Of(s).RequirePLP = true; l3Of(s).PLPProbes = 3 },
			sys: func(f *fakeSys) {
				f.plp[l3dir] = plpAnswer{res: l3disk.PLPResult{Probes: 3, Median: 3 * time.Millisecond, Max: 5 * time.Millisecond}}
			},
			want: Fail, msg: []string{"require_plp: true", "set require_plp: false"}, calls: []string{"plp " + l3dir + " 3"}},
		{name: "probes 0 still probes", check: CheckPLP,
			stack: func(s *config.Stack) { l3Of(s).PLPProbes = 0 },
			want:  Pass, calls: []string{"plp " + l3dir + " 8"}},
		{name: "tmpfs is not durable", check: CheckPLP,
			sys: func(f *fakeSys) {
				f.statfs[l3dir] = FSStat{Type: unix.TMPFS_MAGIC, BlockSize: 4096, Blocks: 1 << 30, Avail: 1 << 30, Device: 1}
			},
			want: Warn, msg: []string{"memory file system", "survives a reboot"}, calls: []string{}},
		{name: "tmpfs with require_plp", check: CheckPLP,
			stack: func(s *config.Stack) { l3Of(s).RequirePLP = true },
			sys: func(f *fakeSys) {
				f.statfs[l3dir] = FSStat{Type: unix.RAMFS_MAGIC, BlockSize: 4096, Device: 1}
			},
			want: Fail, msg: []string{"require_plp: true", "real device"}, calls: []string{}},
		{name: "probe error", check: CheckPLP,
			sys:  func(f *fakeSys) { f.plp[l3dir] = plpAnswer{err: errors.New("plp probe: EIO")} },
			want: Fail, msg: []string{"power-loss probe failed (plp probe: EIO)"}},

		// disk_free: the default budget is 64 GiB.
		{name: "room", check: CheckDiskFree, want: Pass, msg: []string{"budgets 64.00 GiB fit in 512.00 GiB free"}},
		{name: "no room", check: CheckDiskFree,
			sys: func(f *fakeSys) {
				f.statfs[l3dir] = FSStat{BlockSize: 4096, Blocks: uint64(100 * gib / 4096), Avail: uint64(10 * gib / 4096), Device: 1}
			},
			want: Fail, msg: []string{"only 10.00 GiB free", "free 54.00 GiB there or lower the budgets"}},
		{name: "slab files already there count", check: CheckDiskFree,
			sys: func(f *fakeSys) {
				f.statfs[l3dir] = FSStat{BlockSize: 4096, Blocks: uint64(100 * gib / 4096), Avail: uint64(10 * gib / 4096), Device: 1}
				a, b := filepath.Join(l3dir, l3disk.SlabFileName("s", 0, 0)), filepath.Join(l3dir, l3disk.SlabFileName("s", 1, 0))
				f.globs = map[string][]string{filepath.Join(l3dir, l3SlabGlob): {a, b}}
				f.stats[a], f.stats[b] = fakeInfo{name: "a", size: 30 * gib}, fakeInfo{name: "b", size: 30 * gib}
			},
			want: Pass, msg: []string{"60.00 GiB already in slab files"}},
		{name: "nearly full", check: CheckDiskFree,
			sys: func(f *fakeSys) {
				f.statfs[l3dir] = FSStat{BlockSize: 4096, Blocks: uint64(100 * gib / 4096), Avail: uint64(66 * gib / 4096), Device: 1}
			},
			want: Warn, msg: []string{"over 95% full"}},
		{name: "two disks on one file system add up", check: CheckDiskFree,
			stack: func(s *config.Stack) {
				c := l3Of(s)
				c.Disks = append(c.Disks, l3disk.Disk{Dir: "/var/tmp/kvtier/l3b", Budget: c.Disks[0].Budget})
				s.Ranks.WorldSize = 2
			},
			sys: func(f *fakeSys) {
				f.statfs[l3dir] = FSStat{BlockSize: 4096, Blocks: uint64(1000 * gib / 4096), Avail: uint64(100 * gib / 4096), Device: 1}
				f.statfs["/var/tmp/kvtier/l3b"] = f.statfs[l3dir]
				f.stats["/var/tmp/kvtier/l3b"] = fakeInfo{name: "l3b", mode: fs.ModeDir | 0o755}
			},
			want: Fail, msg: []string{"budgets 128.00 GiB, but only 100.00 GiB free"}},
		{name: "a disk no rank uses needs nothing", check: CheckDiskFree,
			stack: func(s *config.Stack) {
				c := l3Of(s)
				c.Disks = append(c.Disks, l3disk.Disk{Dir: "/nowhere", Budget: c.Disks[0].Budget})
			},
			want: Pass, msg: []string{"[/var/tmp/kvtier/l3]: budgets 64.00 GiB"}},

		// lmdb_map_size: 64 GiB of 2.75 MiB + 4 KiB slots is 23797 entries,
		// 2379700 bytes, plus the map's delete reserve (an eighth of it).
		{name: "map large enough", check: CheckLMDBMapSize, want: Pass, msg: []string{"the slots can produce 23797"}},
		{name: "map too small", check: CheckLMDBMapSize,
			stack: func(s *config.Stack) { lmdbOf(s).MapSizeBytes = 1 << 20 },
			want:  Fail, msg: []string{"evicts to fit", "128.00 KiB delete reserve", "map_size_bytes to at least 3105697"}},
		{name: "map without headroom", check: CheckLMDBMapSize,
			stack: func(s *config.Stack) { lmdbOf(s).MapSizeBytes = 2800000 },
			want:  Warn, msg: []string{"headroom"}},
		{name: "badger grows", check: CheckLMDBMapSize,
			stack: func(s *config.Stack) { s.Tiers[1].Index = &config.IndexSpec{Use: "badger"} },
			want:  Pass, msg: []string{"badger"}},
		{name: "budget holds no slot", check: CheckLMDBMapSize,
			stack: func(s *config.Stack) { l3Of(s).Disks[0].Budget = 4096 },
			want:  Fail, msg: []string{"holds no slot"}},

		// api_socket
		{name: "tcp", check: CheckAPISocket, want: Pass, msg: []string{"TCP 127.0.0.1:9401"}},
		{name: "socket dir ok", check: CheckAPISocket,
			stack: func(s *config.Stack) { s.API.Listen = "unix:/run/kvtier/api.sock" },
			sys:   func(f *fakeSys) { f.stats["/run/kvtier"] = fakeInfo{name: "kvtier", mode: fs.ModeDir | 0o750} },
			want:  Pass, msg: []string{"/run/kvtier exists"}},
		{name: "socket dir missing", check: CheckAPISocket,
			stack: func(s *config.Stack) { s.API.Listen = "/run/kvtier/api.sock" },
			sys:   func(f *fakeSys) { f.stats["/run"] = fakeInfo{name: "run", mode: fs.ModeDir | 0o755} },
			want:  Pass, msg: []string{"the socket /run/kvtier/api.sock is free", "/run/kvtier does not exist yet: serve creates it (mode 0700) in /run"}},
		{name: "socket dir missing, parent not writable", check: CheckAPISocket,
			stack: func(s *config.Stack) { s.API.Listen = "/run/kvtier/api.sock" },
			sys: func(f *fakeSys) {
				f.stats["/run"] = fakeInfo{name: "run", mode: fs.ModeDir | 0o755}
				f.noAccess = map[string]error{"/run": fs.ErrPermission}
			},
			want: Fail, msg: []string{"does not exist and serve cannot create it in /run", "install -d -m 0700"}},
		{name: "socket dir world-writable", check: CheckAPISocket,
			stack: func(s *config.Stack) { s.API.Listen = "unix:///run/kvtier/api.sock" },
			sys:   func(f *fakeSys) { f.stats["/run/kvtier"] = fakeInfo{name: "kvtier", mode: fs.ModeDir | 0o777} },
			want:  Fail, msg: []string{"world-writable", "chmod o-w /run/kvtier"}},
		{name: "socket dir sticky tmp", check: CheckAPISocket,
			stack: func(s *config.Stack) { s.API.Listen = "unix:/tmp/api.sock" },
			sys:   func(f *fakeSys) { f.stats["/tmp"] = fakeInfo{name: "tmp", mode: fs.ModeDir | fs.ModeSticky | 0o777} },
			want:  Warn, msg: []string{"world-writable (sticky)"}},
		{name: "socket dir not writable", check: CheckAPISocket,
			stack: func(s *config.Stack) { s.API.Listen = "unix:/run/kvtier/api.sock" },
			sys: func(f *fakeSys) {
				f.stats["/run/kvtier"] = fakeInfo{name: "kvtier", mode: fs.ModeDir | 0o755}
				f.noAccess = map[string]error{"/run/kvtier": fs.ErrPermission}
			},
			want: Fail, msg: []string{"cannot create its socket"}},
		{name: "socket parent is a file", check: CheckAPISocket,
			stack: func(s *config.Stack) { s.API.Listen = "unix:/run/kvtier/api.sock" },
			sys:   func(f *fakeSys) { f.stats["/run/kvtier"] = fakeInfo{name: "kvtier", mode: 0o644} },
			want:  Fail, msg: []string{"is not a directory"}},

		// plugin_pins
		{name: "no plugins", check: CheckPluginPins, want: Pass, msg: []string{"no plugin"}},
		{name: "pinned plugin", check: CheckPluginPins, stack: withPlugin, sys: pluginBinary,
			want: Pass, msg: []string{"$.tiers[2].plugin: /opt/kvtier/plugin-remote is executable and matches its pin"}},
		{name: "plugin missing", check: CheckPluginPins, stack: withPlugin,
			want: Fail, msg: []string{"does not exist", "make plugins"}},
		{name: "plugin not executable", check: CheckPluginPins, stack: withPlugin,
			sys: func(f *fakeSys) {
				pluginBinary(f)
				f.stats["/opt/kvtier/plugin-remote"] = fakeInfo{name: "plugin-remote", mode: 0o644}
			},
			want: Fail, msg: []string{"not executable", "chmod +x /opt/kvtier/plugin-remote"}},
		{name: "plugin is a directory", check: CheckPluginPins, stack: withPlugin,
			sys: func(f *fakeSys) {
				f.stats["/opt/kvtier/plugin-remote"] = fakeInfo{name: "plugin-remote", mode: fs.ModeDir | 0o755}
			},
			want: Fail, msg: []string{"not a regular file"}},
		{name: "plugin changed", check: CheckPluginPins, stack: withPlugin,
			sys: func(f *fakeSys) {
				pluginBinary(f)
				f.sums["/opt/kvtier/plugin-remote"] = otherSum
			},
			want: Fail, msg: []string{"has SHA-256 " + otherSum + ", the config pins " + goodSum, "kvtier plugin sum /opt/kvtier/plugin-remote"}},
		{name: "index plugin", check: CheckPluginPins,
			stack: func(s *config.Stack) {
				s.Tiers[1].Index = &config.IndexSpec{Plugin: &config.PluginSpec{Path: "/opt/kvtier/plugin-remote", SHA256: goodSum}}
			},
			sys: pluginBinary, want: Pass, msg: []string{"$.tiers[1].index.plugin"}},
	}
	for _, tt := range tests {
		t.Run(tt.check+"/"+tt.name, func(t *testing.T) {
			st := defaultStack(t)
			if tt.stack != nil {
				tt.stack(st)
			}
			sys := healthyMachine()
			if tt.sys != nil {
				tt.sys(sys)
			}
			rep := Run(context.Background(), st, sys)
			i := slices.IndexFunc(rep.Checks, func(r Result) bool { return r.Name == tt.check })
			if i < 0 {
				t.Fatalf("no %s check in the report", tt.check)
			}
			got := rep.Checks[i]
			if got.Status != tt.want {
				t.Errorf("status %s, want %s; message: %s", got.Status, tt.want, got.Message)
			}
			for _, m := range tt.msg {
				if !strings.Contains(got.Message, m) {
					t.Errorf("message %q does not contain %q", got.Message, m)
				}
			}
			if tt.calls != nil {
				var calls []string
				for _, c := range sys.calls {
					if strings.HasPrefix(c, map[string]string{CheckODirect: "odirect", CheckPLP: "plp"}[tt.check]+" ") {
						calls = append(calls, c)
					}
				}
				if !slices.Equal(calls, tt.calls) {
					t.Errorf("probe calls %q, want %q", calls, tt.calls)
				}
			}
			if rep.OK != !slices.ContainsFunc(rep.Checks, func(r Result) bool { return r.Status == Fail }) {
				t.Errorf("report OK %v does not match its checks", rep.OK)
			}
			if _, err := json.Marshal(rep); err != nil {
				t.Errorf("report does not marshal: %v", err)
			}
		})
	}
}

// TestRunHealthy runs every check on a healthy fake machine: all pass, in
// Names() order, with a detail object each.
func TestRunHealthy(t *testing.T) {
	rep := Run(context.Background(), defaultStack(t), healthyMachine())
	var names []string
	for _, r := range rep.Checks {
		names = append(names, r.Name)
		if r.Status != Pass {
			t.Errorf("%s: %s: %s", r.Name, r.Status, r.Message)
		}
		if r.Detail == nil {
			t.Errorf("%s: nil detail", r.Name)
		}
	}
	if !slices.Equal(names, Names()) {
		t.Errorf("checks %q, want %q", names, Names())
	}
	if !rep.OK {
		t.Error("report not OK")
	}
	if p, w, f := rep.Counts(); p != len(Names()) || w != 0 || f != 0 {
		t.Errorf("counts %d/%d/%d", p, w, f)
	}
}

// TestRunCancelled fails every check of a cancelled run without probing.
func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	sys := healthyMachine()
	rep := Run(ctx, defaultStack(t), sys)
	if rep.OK || len(rep.Checks) != len(Names()) {
		t.Fatalf("cancelled run: OK %v, %d checks", rep.OK, len(rep.Checks))
	}
	for _, r := range rep.Checks {
		if r.Status != Fail || !strings.Contains(r.Message, "not run: context canceled") {
			t.Errorf("%s: %s %q", r.Name, r.Status, r.Message)
		}
	}
	if len(sys.calls) != 0 {
		t.Errorf("probes ran: %q", sys.calls)
	}
}

// TestSlabGlobMatchesL3 keeps l3SlabGlob in step with l3disk's file names.
func TestSlabGlobMatchesL3(t *testing.T) {
	for _, n := range []string{l3disk.SlabFileName("stack-1", 0, 0), l3disk.SlabFileName("a.b", 17, 255)} {
		if ok, err := filepath.Match(l3SlabGlob, n); err != nil || !ok {
			t.Errorf("%q does not match %q (%v)", n, l3SlabGlob, err)
		}
	}
}

// TestMerge orders failures first and keeps the worst status.
func TestMerge(t *testing.T) {
	r := merge("x", []Result{passf("a"), failf("b"), warnf("c"), failf("d")})
	if r.Status != Fail || r.Message != "b; d; c; a" {
		t.Errorf("merge: %s %q", r.Status, r.Message)
	}
	if got := len(r.Detail["x"].([]map[string]any)); got != 4 {
		t.Errorf("merge kept %d details", got)
	}
}

// TestAPISocketOfServe: with Options.Socket (the socket serve will use,
// as `kvtier doctor` passes it) the check says whether the path is free,
// a stale file or held by a live serve, whatever $.api.listen says.
func TestAPISocketOfServe(t *testing.T) {
	const sock = "/home/u/.local/state/kvtier/kvtier.sock"
	const dir = "/home/u/.local/state/kvtier"
	homeDirs := func(f *fakeSys) {
		f.stats["/home"] = fakeInfo{name: "home", mode: fs.ModeDir | 0o755}
		f.stats["/home/u"] = fakeInfo{name: "u", mode: fs.ModeDir | 0o755}
		f.stats["/home/u/.local"] = fakeInfo{name: ".local", mode: fs.ModeDir | 0o755}
		f.stats["/home/u/.local/state"] = fakeInfo{name: "state", mode: fs.ModeDir | 0o755}
	}
	withDir := func(f *fakeSys) { homeDirs(f); f.stats[dir] = fakeInfo{name: "kvtier", mode: fs.ModeDir | 0o700} }
	withSocket := func(f *fakeSys) {
		withDir(f)
		f.stats[sock] = fakeInfo{name: "kvtier.sock", mode: fs.ModeSocket | 0o600}
	}
	tests := []struct {
		name  string
		sys   func(f *fakeSys)
		want  Status
		state string
		msg   []string
	}{
		{name: "free", sys: withDir, want: Pass, state: "free",
			msg: []string{"the socket " + sock + " is free; its directory " + dir + " exists, is writable"}},
		{name: "free, directory not made yet", sys: homeDirs, want: Pass, state: "free",
			msg: []string{"is free", dir + " does not exist yet: serve creates it (mode 0700) in /home/u/.local/state"}},
		{name: "stale", sys: withSocket, want: Pass, state: "stale",
			msg: []string{sock + " is a stale socket file (no serve answers; serve removes it at start)"}},
		{name: "live serve", sys: func(f *fakeSys) { withSocket(f); f.listening = map[string]bool{sock: true} }, want: Warn, state: "live",
			msg: []string{"a live serve answers on " + sock, "another --socket"}},
		{name: "not a socket", sys: func(f *fakeSys) { withDir(f); f.stats[sock] = fakeInfo{name: "kvtier.sock", mode: 0o644} }, want: Fail, state: "not_socket",
			msg: []string{sock + " exists and is not a socket", "another --socket"}},
		{name: "world-writable dir", sys: func(f *fakeSys) { homeDirs(f); f.stats[dir] = fakeInfo{name: "kvtier", mode: fs.ModeDir | 0o777} }, want: Fail, state: "free",
			msg: []string{"is free; its directory " + dir + " is world-writable"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sys := healthyMachine()
			tt.sys(sys)
			rep := RunOptions(context.Background(), defaultStack(t), sys, Options{Socket: sock})
			i := slices.IndexFunc(rep.Checks, func(r Result) bool { return r.Name == CheckAPISocket })
			got := rep.Checks[i]
			if got.Status != tt.want || got.Detail["state"] != tt.state || got.Detail["socket"] != sock {
				t.Errorf("status %s, detail %v; want %s, state %s; message: %s", got.Status, got.Detail, tt.want, tt.state, got.Message)
			}
			if strings.Contains(got.Message, "TCP") {
				t.Errorf("message %q names the config's TCP address, not serve's socket", got.Message)
			}
			for _, m := range tt.msg {
				if !strings.Contains(got.Message, m) {
					t.Errorf("message %q does not contain %q", got.Message, m)
				}
			}
		})
	}
}

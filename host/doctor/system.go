package doctor

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/plugins/pluginhost"
	"github.com/kvtier/kvtier/tiers/l3disk"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
)

// FSStat is what statfs and stat say about the file system holding a path.
type FSStat struct {
	// Type is the file system's magic number (unix.HUGETLBFS_MAGIC, ...).
	Type int64
	// BlockSize is the block size; on hugetlbfs, the hugepage size.
	BlockSize int64
	// Blocks is the total block count; 0 on a hugetlbfs mount without a
	// size= limit.
	Blocks uint64
	// Avail is the blocks an unprivileged writer may still use.
	Avail uint64
	// Device is the device number of the path (stat's st_dev): two paths
	// with the same Device share one file system and its free space.
	Device uint64
}

// Access modes of System.Access.
const (
	// AccessWrite asks whether the process may create files in a directory.
	AccessWrite = unix.W_OK
	// AccessExec asks whether the process may execute a file.
	AccessExec = unix.X_OK
)

// System is the machine as the checks see it. OS is the real one; tests
// inject a fake.
type System interface {
	// ReadFile reads a small file of /proc or /sys that procfs does not
	// cover (nr_hugepages, the sysfs hugepage pools).
	ReadFile(path string) ([]byte, error)
	// Meminfo reads /proc/meminfo.
	Meminfo() (procfs.Meminfo, error)
	// SelfStatus reads /proc/self/status.
	SelfStatus() (procfs.ProcStatus, error)
	// Statfs reports on the file system holding path.
	Statfs(path string) (FSStat, error)
	// Stat is os.Stat.
	Stat(path string) (fs.FileInfo, error)
	// Access is access(2) with AccessWrite or AccessExec, for the real
	// user of the process.
	Access(path string, mode uint32) error
	// MemlockLimit returns the soft RLIMIT_MEMLOCK in bytes;
	// unix.RLIM_INFINITY means unlimited.
	MemlockLimit() (uint64, error)
	// ProbeODirect creates a scratch file in dir with O_DIRECT, writes one
	// aligned 4 KiB block and removes the file. An error wrapping
	// diskfs.ErrDirectRefused means the file system refuses O_DIRECT.
	ProbeODirect(dir string) error
	// ProbePLP runs the L3 power-loss-protection probe in dir
	// (l3disk.ProbePLP).
	ProbePLP(dir string, probes int, oDirect string, maxSync time.Duration) (l3disk.PLPResult, error)
	// FileSHA256 returns the lowercase hex SHA-256 of a file's contents.
	FileSHA256(path string) (string, error)
	// Glob is filepath.Glob.
	Glob(pattern string) ([]string, error)
}

// SocketDialer is a System that can tell a live unix socket from a stale
// file: the api_socket check uses it when the System has it.
type SocketDialer interface {
	// DialUnix connects to the unix socket at path and closes the
	// connection at once; nil means something listens there.
	DialUnix(path string) error
}

// OS is the real machine.
type OS struct{}

var (
	_ System       = OS{}
	_ SocketDialer = OS{}
)

// dialTimeout bounds DialUnix: a live serve accepts at once.
const dialTimeout = time.Second

// DialUnix implements SocketDialer.
func (OS) DialUnix(path string) error {
	c, err := net.DialTimeout("unix", path, dialTimeout)
	if err != nil {
		return err
	}
	return c.Close()
}

// maxProcFile bounds what ReadFile reads: /proc and /sys files the checks
// read are a few KiB.
const maxProcFile = 1 << 20

// ReadFile implements System; it reads at most 1 MiB.
func (OS) ReadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxProcFile))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return b, nil
}

// Meminfo implements System.
func (OS) Meminfo() (procfs.Meminfo, error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return procfs.Meminfo{}, err
	}
	return fs.Meminfo()
}

// SelfStatus implements System.
func (OS) SelfStatus() (procfs.ProcStatus, error) {
	p, err := procfs.Self()
	if err != nil {
		return procfs.ProcStatus{}, err
	}
	return p.NewStatus()
}

// Statfs implements System.
func (OS) Statfs(path string) (FSStat, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return FSStat{}, &fs.PathError{Op: "statfs", Path: path, Err: err}
	}
	out := FSStat{Type: int64(st.Type), BlockSize: int64(st.Bsize), Blocks: st.Blocks, Avail: st.Bavail}
	if fi, err := os.Stat(path); err == nil {
		if s, ok := fi.Sys().(*syscall.Stat_t); ok {
			out.Device = uint64(s.Dev)
		}
	}
	return out, nil
}

// Stat implements System.
func (OS) Stat(path string) (fs.FileInfo, error) { return os.Stat(path) }

// Access implements System.
func (OS) Access(path string, mode uint32) error {
	if err := unix.Access(path, mode); err != nil {
		return &fs.PathError{Op: "access", Path: path, Err: err}
	}
	return nil
}

// MemlockLimit implements System.
func (OS) MemlockLimit() (uint64, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		return 0, fmt.Errorf("getrlimit RLIMIT_MEMLOCK: %w", err)
	}
	return rl.Cur, nil
}

// ProbeODirect implements System through the L3 store's own file-system
// seam, so it opens files exactly as the store does.
func (OS) ProbeODirect(dir string) (err error) {
	fsys := diskfs.OS{}
	path := filepath.Join(dir, fmt.Sprintf(".kvtier-doctor-odirect-%d-%d", os.Getpid(), time.Now().UnixNano()))
	f, err := fsys.OpenFile(path, diskfs.OpenOptions{Create: true, Direct: true})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.Close(), fsys.Remove(path)) }()
	buf, err := diskfs.NewAlignedBuffer(diskfs.BlockSize)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, buf.Free()) }()
	if _, err := f.WriteAt(buf.Bytes(), 0); err != nil {
		// Some file systems accept the O_DIRECT open and refuse the
		// transfer: that is a refusal too.
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("o_direct write in %s: %w: %w", dir, err, diskfs.ErrDirectRefused)
		}
		return fmt.Errorf("o_direct write in %s: %w", dir, err)
	}
	return nil
}

// ProbePLP implements System with l3disk.ProbePLP on the real disk.
func (OS) ProbePLP(dir string, probes int, oDirect string, maxSync time.Duration) (l3disk.PLPResult, error) {
	return l3disk.ProbePLP(diskfs.OS{}, dir, probes, oDirect, maxSync)
}

// FileSHA256 implements System with the hash `kvtier plugin sum` prints.
func (OS) FileSHA256(path string) (string, error) { return pluginhost.FileSHA256(path) }

// Glob implements System.
func (OS) Glob(pattern string) ([]string, error) { return filepath.Glob(pattern) }

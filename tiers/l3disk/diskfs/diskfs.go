// Package diskfs is the file-system seam of the L3 disk store: the handful
// of file operations the store performs (open with or without O_DIRECT,
// positional reads and writes, fdatasync, an exclusive advisory lock), behind
// an interface so that tests can inject faults (see package errorfs) without
// root tricks, in the manner of pebble's vfs.
//
// The package does I/O and nothing else: it never retries a failed
// operation, never hides a short transfer and never decides what a failure
// means. That is the store's job.
package diskfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// BlockSize is the alignment O_DIRECT transfers need on every file system
// kvtier supports: buffer address, file offset and length are multiples of it.
const BlockSize = 4096

// ErrLocked means another open file description (another process, or the
// same process twice) holds the file's exclusive lock.
var ErrLocked = errors.New("file locked by another opener")

// ErrDirectRefused means the file system refused O_DIRECT (tmpfs, some
// FUSE and network file systems). Callers that allow it fall back to
// buffered I/O with fdatasync.
var ErrDirectRefused = errors.New("o_direct refused by the file system")

// OpenOptions says how to open a file.
type OpenOptions struct {
	// Create creates the file if it does not exist.
	Create bool
	// Direct asks for O_DIRECT; the open fails with ErrDirectRefused if the
	// file system does not support it.
	Direct bool
}

// FS is the file system as the disk store sees it.
type FS interface {
	// OpenFile opens path for reading and writing.
	OpenFile(path string, opts OpenOptions) (File, error)
	// MkdirAll creates a directory and its parents.
	MkdirAll(path string) error
	// Remove removes a file.
	Remove(path string) error
	// SyncDir fsyncs a directory so that a file created in it survives a
	// crash.
	SyncDir(path string) error
}

// File is one open file.
type File interface {
	// ReadAt reads len(p) bytes at off; a short read returns an error.
	ReadAt(p []byte, off int64) (int, error)
	// WriteAt writes len(p) bytes at off; a short write returns an error.
	WriteAt(p []byte, off int64) (int, error)
	// WritevAt writes the buffers back to back from off in one transfer
	// (pwritev): a slot's header block from the store's own buffer and
	// its payload straight from the caller's memory. With O_DIRECT every
	// buffer's address and length are multiples of BlockSize. A short
	// write returns an error.
	WritevAt(bufs [][]byte, off int64) (int, error)
	// ReadvAt reads into the buffers back to back from off in one
	// transfer (preadv); as WritevAt.
	ReadvAt(bufs [][]byte, off int64) (int, error)
	// Datasync flushes the file's data (and the metadata needed to read
	// it) to stable storage.
	Datasync() error
	// Size returns the file's length.
	Size() (int64, error)
	// Truncate sets the file's length.
	Truncate(size int64) error
	// Lock takes an exclusive advisory lock (flock) without waiting; it
	// fails with ErrLocked when another opener holds it.
	Lock() error
	// Direct reports whether the file was opened with O_DIRECT.
	Direct() bool
	// Name returns the path the file was opened with.
	Name() string
	// Close closes the file (releasing its lock).
	Close() error
}

// OS is the real file system.
type OS struct{}

var _ FS = OS{}

// OpenFile implements FS.
func (OS) OpenFile(path string, opts OpenOptions) (File, error) {
	// NB: O_NOFOLLOW so the store never writes through a symlink planted
	// in its directory, and O_NONBLOCK so a FIFO in a slab's place cannot
	// hang the open; the fstat below refuses anything but a regular file
	// before a byte is read or written (O_NONBLOCK has no effect on one).
	flags := os.O_RDWR | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK
	if opts.Create {
		flags |= os.O_CREATE
	}
	if opts.Direct {
		flags |= unix.O_DIRECT
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		switch {
		case opts.Direct && errors.Is(err, unix.EINVAL):
			return nil, fmt.Errorf("open %s: %w", path, ErrDirectRefused)
		case errors.Is(err, unix.ELOOP):
			return nil, fmt.Errorf("open %s: it is a symbolic link; only regular files are used, never followed: %w", path, ErrNotRegular)
		case errors.Is(err, unix.EISDIR):
			return nil, fmt.Errorf("open %s: it is a directory, not a regular file: %w", path, ErrNotRegular)
		}
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		_ = f.Close()
		return nil, fmt.Errorf("open %s: it is a %s, not a regular file: %w", path, fileType(st.Mode()), ErrNotRegular)
	}
	return &osFile{f: f, direct: opts.Direct}, nil
}

// ErrNotRegular means a path the store would open is a symbolic link, a
// directory, a FIFO, a device or a socket: the store reads and writes only
// regular files.
var ErrNotRegular = errors.New("not a regular file")

// fileType names a non-regular file mode for error messages.
func fileType(m os.FileMode) string {
	switch {
	case m&os.ModeSymlink != 0:
		return "symbolic link"
	case m.IsDir():
		return "directory"
	case m&os.ModeNamedPipe != 0:
		return "fifo"
	case m&os.ModeCharDevice != 0:
		return "character device"
	case m&os.ModeDevice != 0:
		return "block device"
	case m&os.ModeSocket != 0:
		return "socket"
	}
	return "irregular file (" + m.Type().String() + ")"
}

// MkdirAll implements FS.
func (OS) MkdirAll(path string) error {
	if err := os.MkdirAll(path, 0o755); err != nil {
		return fmt.Errorf("mkdir %s: %w", path, err)
	}
	return nil
}

// Remove implements FS.
func (OS) Remove(path string) error {
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// SyncDir implements FS.
func (OS) SyncDir(path string) error {
	d, err := os.Open(filepath.Clean(path))
	if err != nil {
		return fmt.Errorf("open dir %s: %w", path, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", path, err)
	}
	return nil
}

type osFile struct {
	f      *os.File
	direct bool
}

func (o *osFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := o.f.ReadAt(p, off)
	if err == io.EOF && n < len(p) {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return n, fmt.Errorf("read %s at %d (%d bytes, got %d): %w", o.f.Name(), off, len(p), n, err)
	}
	return n, nil
}

func (o *osFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := o.f.WriteAt(p, off)
	if err != nil {
		return n, fmt.Errorf("write %s at %d (%d bytes, wrote %d): %w", o.f.Name(), off, len(p), n, err)
	}
	return n, nil
}

func (o *osFile) WritevAt(bufs [][]byte, off int64) (int, error) {
	return o.vector(bufs, off, true)
}

func (o *osFile) ReadvAt(bufs [][]byte, off int64) (int, error) {
	return o.vector(bufs, off, false)
}

// vector runs pwritev or preadv until every buffer is transferred: the
// kernel may stop short (a signal, a file system's limit on one call), and
// the rest goes from where it stopped. A read that reaches the end of the
// file short is io.ErrUnexpectedEOF.
func (o *osFile) vector(bufs [][]byte, off int64, write bool) (int, error) {
	op, total := "read", 0
	if write {
		op = "write"
	}
	for _, b := range bufs {
		total += len(b)
	}
	done := 0
	rest := bufs
	for len(rest) > 0 {
		var n int
		var err error
		if write {
			n, err = unix.Pwritev(int(o.f.Fd()), rest, off+int64(done))
		} else {
			n, err = unix.Preadv(int(o.f.Fd()), rest, off+int64(done))
		}
		if err == unix.EINTR {
			continue
		}
		if err == nil && n == 0 {
			if write {
				err = io.ErrShortWrite
			} else {
				err = io.ErrUnexpectedEOF
			}
		}
		if err != nil {
			return done, fmt.Errorf("%sv %s at %d (%d bytes in %d buffers, %d done): %w", op, o.f.Name(), off, total, len(bufs), done, err)
		}
		done += n
		// Drop what went; keep the rest of a buffer cut in the middle.
		for n > 0 && len(rest) > 0 {
			if n < len(rest[0]) {
				first := make([][]byte, len(rest))
				copy(first, rest)
				first[0] = first[0][n:]
				rest, n = first, 0
				break
			}
			n -= len(rest[0])
			rest = rest[1:]
		}
	}
	return done, nil
}

func (o *osFile) Datasync() error {
	if err := unix.Fdatasync(int(o.f.Fd())); err != nil {
		return fmt.Errorf("fdatasync %s: %w", o.f.Name(), err)
	}
	return nil
}

func (o *osFile) Size() (int64, error) {
	st, err := o.f.Stat()
	if err != nil {
		return 0, fmt.Errorf("stat %s: %w", o.f.Name(), err)
	}
	return st.Size(), nil
}

func (o *osFile) Truncate(size int64) error {
	if err := o.f.Truncate(size); err != nil {
		return fmt.Errorf("truncate %s to %d: %w", o.f.Name(), size, err)
	}
	return nil
}

func (o *osFile) Lock() error {
	err := unix.Flock(int(o.f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return fmt.Errorf("lock %s: %w", o.f.Name(), ErrLocked)
	}
	if err != nil {
		return fmt.Errorf("lock %s: %w", o.f.Name(), err)
	}
	return nil
}

func (o *osFile) Direct() bool { return o.direct }
func (o *osFile) Name() string { return o.f.Name() }

func (o *osFile) Close() error {
	if err := o.f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", o.f.Name(), err)
	}
	return nil
}

// AlignedBuffer is a page-aligned anonymous memory mapping, usable as an
// O_DIRECT transfer buffer. It must be released with Free.
type AlignedBuffer struct {
	mapping []byte // what Munmap needs
	b       []byte
}

// hugePage is the transparent huge page size buffers of at least this size
// are aligned to and advised for: an O_DIRECT transfer pins its buffer's
// pages, and pinning a few 2 MiB pages costs far less CPU than hundreds of
// 4 KiB ones.
const hugePage = 2 << 20

// NewAlignedBuffer maps size bytes (rounded up to BlockSize) of anonymous
// memory. The mapping is page-aligned, hence BlockSize-aligned; from
// 2 MiB up it is 2 MiB-aligned and advised for transparent huge pages.
func NewAlignedBuffer(size int) (*AlignedBuffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("aligned buffer of %d bytes: size must be positive", size)
	}
	n := int(RoundUp(int64(size)))
	slack, whole := 0, n
	if n >= hugePage {
		// Whole huge pages: a tail of 4 KiB pages would be pinned page by
		// page on every transfer.
		slack, whole = hugePage, (n+hugePage-1)/hugePage*hugePage
	}
	m, err := unix.Mmap(-1, 0, whole+slack, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("map aligned buffer of %d bytes: %w", n, err)
	}
	start := 0
	if slack > 0 {
		if rem := int(uintptr(unsafe.Pointer(&m[0])) % hugePage); rem != 0 {
			start = hugePage - rem
		}
	}
	b := m[start : start+n : start+n]
	if uintptr(unsafe.Pointer(&b[0]))%BlockSize != 0 {
		// NB: mmap returns page-aligned memory; this is a broken invariant.
		panic("diskfs: mmap returned memory that is not 4 KiB aligned")
	}
	if slack > 0 {
		// Advice only: without THP the buffer works the same, slower.
		_ = unix.Madvise(m[start:start+whole], unix.MADV_HUGEPAGE)
	}
	return &AlignedBuffer{mapping: m, b: b}, nil
}

// Bytes returns the whole buffer.
func (a *AlignedBuffer) Bytes() []byte { return a.b }

// Free unmaps the buffer; Bytes must not be used afterwards.
func (a *AlignedBuffer) Free() error {
	if a.mapping == nil {
		return nil
	}
	err := unix.Munmap(a.mapping)
	a.mapping, a.b = nil, nil
	if err != nil {
		return fmt.Errorf("unmap aligned buffer: %w", err)
	}
	return nil
}

// Aligned reports whether p can be an O_DIRECT transfer buffer as it is:
// its address and length are multiples of BlockSize (and it is not
// empty).
func Aligned(p []byte) bool {
	return len(p) > 0 && len(p)%BlockSize == 0 && uintptr(unsafe.Pointer(&p[0]))%BlockSize == 0
}

// RoundUp rounds n up to a multiple of BlockSize.
func RoundUp(n int64) int64 { return (n + BlockSize - 1) / BlockSize * BlockSize }

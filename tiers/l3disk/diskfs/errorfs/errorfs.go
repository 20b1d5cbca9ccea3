// Package errorfs wraps a diskfs.FS and injects faults into it: EIO or
// ENOSPC on read, write, fdatasync or open, short writes, torn writes at
// 4 KiB granularity, bit flips in what is written or read, and latency. It
// exists for tests (pebble's errorfs is the model): it is a fault injector,
// not a fake — every operation it does not alter goes to the wrapped file
// system unchanged.
//
// It must never be used outside tests and benchmarks of failure handling.
package errorfs

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
)

// Op is the kind of an intercepted operation.
type Op uint8

const (
	// OpOpen is OpenFile.
	OpOpen Op = iota + 1
	// OpRead is File.ReadAt.
	OpRead
	// OpWrite is File.WriteAt.
	OpWrite
	// OpSync is File.Datasync.
	OpSync
)

// String names the op.
func (o Op) String() string {
	switch o {
	case OpOpen:
		return "open"
	case OpRead:
		return "read"
	case OpWrite:
		return "write"
	case OpSync:
		return "sync"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Event describes one intercepted operation.
type Event struct {
	// Op is the operation.
	Op Op
	// Path is the file's path.
	Path string
	// Off and Len are the transfer's file offset and length (reads and
	// writes only).
	Off int64
	Len int
	// Direct is set for an OpOpen asking for O_DIRECT.
	Direct bool
}

// Kind is what a Fault does.
type Kind uint8

const (
	// Fail returns Err without doing the operation.
	Fail Kind = iota + 1
	// ShortWrite writes the first Keep bytes, then returns Err (EIO if
	// nil) with the short count.
	ShortWrite
	// TornWrite writes only the first Keep bytes, rounded down to 4 KiB,
	// and reports success: what a crash in the middle of the transfer
	// leaves on disk, as the writer never learns.
	TornWrite
	// FlipBit flips bit Bit of byte At of the transfer (a write stores the
	// flipped byte; a read returns it) and reports success.
	FlipBit
	// Delay sleeps for Latency, then does the operation normally.
	Delay
)

// Fault is one injected failure.
type Fault struct {
	Kind Kind
	// Err is the error for Fail and ShortWrite, e.g. unix.EIO or
	// unix.ENOSPC.
	Err error
	// Keep is the number of bytes ShortWrite and TornWrite let through.
	Keep int
	// At and Bit locate the flipped bit for FlipBit.
	At  int
	Bit uint8
	// Latency is the Delay's sleep.
	Latency time.Duration
}

// Injector decides, per operation, whether to inject a fault. It must be
// safe for concurrent use. A nil Fault means no injection.
type Injector interface {
	Inject(e Event) *Fault
}

// InjectorFunc adapts a function to Injector.
type InjectorFunc func(e Event) *Fault

// Inject implements Injector.
func (f InjectorFunc) Inject(e Event) *Fault { return f(e) }

// Rule injects Fault into operations of kind Op on paths containing
// PathContains, skipping the first Skip matches and then injecting into
// Count matches (0 = every later match). With Probability in (0, 1) a
// match is injected only with that probability, drawn from the rule's
// seeded source.
type Rule struct {
	Op           Op
	PathContains string
	Skip, Count  int64
	Probability  float64
	Fault        Fault

	seen, fired atomic.Int64
	mu          sync.Mutex
	rng         *rand.Rand
}

// NewRule returns a rule; seed drives Probability.
func NewRule(op Op, fault Fault, seed uint64) *Rule {
	return &Rule{Op: op, Fault: fault, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Fired returns how many times the rule injected its fault.
func (r *Rule) Fired() int64 { return r.fired.Load() }

// Inject implements Injector.
func (r *Rule) Inject(e Event) *Fault {
	if e.Op != r.Op || (r.PathContains != "" && !strings.Contains(e.Path, r.PathContains)) {
		return nil
	}
	n := r.seen.Add(1)
	if n <= r.Skip {
		return nil
	}
	if r.Probability > 0 && r.Probability < 1 {
		r.mu.Lock()
		hit := r.rng == nil || r.rng.Float64() < r.Probability
		r.mu.Unlock()
		if !hit {
			return nil
		}
	}
	if r.Count > 0 {
		if f := r.fired.Add(1); f > r.Count {
			r.fired.Add(-1)
			return nil
		}
	} else {
		r.fired.Add(1)
	}
	f := r.Fault
	return &f
}

// Rules tries each injector in order and returns the first fault.
type Rules []Injector

// Inject implements Injector.
func (rs Rules) Inject(e Event) *Fault {
	for _, r := range rs {
		if f := r.Inject(e); f != nil {
			return f
		}
	}
	return nil
}

// FS wraps a diskfs.FS with an Injector.
type FS struct {
	inner diskfs.FS
	inj   atomic.Pointer[injectorBox]
}

type injectorBox struct{ Injector }

var _ diskfs.FS = (*FS)(nil)

// Wrap returns fs with faults from inj (nil: none until SetInjector).
func Wrap(fs diskfs.FS, inj Injector) *FS {
	e := &FS{inner: fs}
	e.SetInjector(inj)
	return e
}

// SetInjector replaces the injector; nil disables injection.
func (e *FS) SetInjector(inj Injector) {
	if inj == nil {
		e.inj.Store(nil)
		return
	}
	e.inj.Store(&injectorBox{inj})
}

func (e *FS) fault(ev Event) *Fault {
	b := e.inj.Load()
	if b == nil {
		return nil
	}
	f := b.Inject(ev)
	if f != nil && f.Kind == Delay {
		time.Sleep(f.Latency)
		return nil
	}
	return f
}

// OpenFile implements diskfs.FS.
func (e *FS) OpenFile(path string, opts diskfs.OpenOptions) (diskfs.File, error) {
	if f := e.fault(Event{Op: OpOpen, Path: path, Direct: opts.Direct}); f != nil && f.Kind == Fail {
		return nil, fmt.Errorf("open %s: injected: %w", path, errOr(f.Err))
	}
	inner, err := e.inner.OpenFile(path, opts)
	if err != nil {
		return nil, err
	}
	return &file{File: inner, fs: e}, nil
}

// MkdirAll implements diskfs.FS.
func (e *FS) MkdirAll(path string) error { return e.inner.MkdirAll(path) }

// Remove implements diskfs.FS.
func (e *FS) Remove(path string) error { return e.inner.Remove(path) }

// SyncDir implements diskfs.FS.
func (e *FS) SyncDir(path string) error { return e.inner.SyncDir(path) }

type file struct {
	diskfs.File
	fs *FS
}

func errOr(err error) error {
	if err == nil {
		return unix.EIO
	}
	return err
}

func (f *file) ReadAt(p []byte, off int64) (int, error) {
	ft := f.fs.fault(Event{Op: OpRead, Path: f.Name(), Off: off, Len: len(p)})
	if ft != nil && ft.Kind == Fail {
		return 0, fmt.Errorf("read %s at %d: injected: %w", f.Name(), off, errOr(ft.Err))
	}
	n, err := f.File.ReadAt(p, off)
	if err == nil && ft != nil && ft.Kind == FlipBit && ft.At >= 0 && ft.At < len(p) {
		p[ft.At] ^= 1 << (ft.Bit % 8)
	}
	return n, err
}

func (f *file) WriteAt(p []byte, off int64) (int, error) {
	ft := f.fs.fault(Event{Op: OpWrite, Path: f.Name(), Off: off, Len: len(p)})
	if ft == nil {
		return f.File.WriteAt(p, off)
	}
	switch ft.Kind {
	case Fail:
		return 0, fmt.Errorf("write %s at %d: injected: %w", f.Name(), off, errOr(ft.Err))
	case ShortWrite, TornWrite:
		keep := min(max(ft.Keep, 0), len(p))
		if f.Direct() || ft.Kind == TornWrite {
			keep = keep / diskfs.BlockSize * diskfs.BlockSize
		}
		if keep > 0 {
			if _, err := f.File.WriteAt(p[:keep], off); err != nil {
				return 0, err
			}
		}
		if ft.Kind == TornWrite {
			return len(p), nil
		}
		return keep, fmt.Errorf("write %s at %d: injected short write (%d of %d bytes): %w", f.Name(), off, keep, len(p), errOr(ft.Err))
	case FlipBit:
		// NB: flip in a private aligned copy: the caller's buffer is not
		// ours to change, and O_DIRECT needs the copy aligned too.
		buf, err := diskfs.NewAlignedBuffer(len(p))
		if err != nil {
			return 0, err
		}
		defer func() { _ = buf.Free() }()
		q := buf.Bytes()[:len(p)]
		copy(q, p)
		if ft.At >= 0 && ft.At < len(q) {
			q[ft.At] ^= 1 << (ft.Bit % 8)
		}
		return f.File.WriteAt(q, off)
	}
	return f.File.WriteAt(p, off)
}

// WritevAt runs a vectored write as one WriteAt of the buffers gathered
// into an aligned copy, so that every fault a WriteAt can suffer (failure,
// short or torn write, flipped bit) hits the vectored path alike. The copy
// is this fault-injecting fake's cost, not the real file's.
func (f *file) WritevAt(bufs [][]byte, off int64) (int, error) {
	q, free, err := staged(bufs)
	if err != nil {
		return 0, err
	}
	defer free()
	at := 0
	for _, b := range bufs {
		at += copy(q[at:], b)
	}
	return f.WriteAt(q, off)
}

// ReadvAt reads through ReadAt (and its faults) into an aligned copy, then
// scatters it into the buffers.
func (f *file) ReadvAt(bufs [][]byte, off int64) (int, error) {
	q, free, err := staged(bufs)
	if err != nil {
		return 0, err
	}
	defer free()
	n, err := f.ReadAt(q, off)
	at := 0
	for _, b := range bufs {
		at += copy(b, q[min(at, n):n])
	}
	return n, err
}

// staged returns an aligned buffer as long as the buffers together, and
// the func that frees it.
func staged(bufs [][]byte) ([]byte, func(), error) {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	buf, err := diskfs.NewAlignedBuffer(max(n, 1))
	if err != nil {
		return nil, nil, err
	}
	return buf.Bytes()[:n], func() { _ = buf.Free() }, nil
}

func (f *file) Datasync() error {
	if ft := f.fs.fault(Event{Op: OpSync, Path: f.Name()}); ft != nil && ft.Kind == Fail {
		return fmt.Errorf("fdatasync %s: injected: %w", f.Name(), errOr(ft.Err))
	}
	return f.File.Datasync()
}

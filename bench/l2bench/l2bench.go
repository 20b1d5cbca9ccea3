// Package l2bench measures the L2 hub: copying pages into a hugetlbfs slab
// against an anonymous mapping and a plain Go slice copy; gathering one
// page's per-layer slices (layer-first layout) into a contiguous slab page
// and scattering them back with internal/memcopy's streaming stores (and,
// for reference, with one Go copy per slice), against one copy of the
// same bytes; the deterministic allocator's reserve+release rate with 100k
// live objects; and the digest time of a 500k-page slab. Every figure comes with a
// reference measured in the same run, as internal/benchreport results.
//
// `kvtier bench l2` and the package's `go test -bench` benchmarks share
// these kernels and setups. The package sets up nothing machine-wide
// itself: the caller passes the hugetlbfs mount (tiers/l2hugetlb/hugetest
// makes one).
package l2bench

import (
	"github.com/kvtier/kvtier/internal/measure"

	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/host/placement"
	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/kvtier/kvtier/internal/memcopy"
	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l2hugetlb"
)

// Options sizes the measurements.
type Options struct {
	// CopyBytes is the size of each copy destination and of the source.
	CopyBytes int64
	// ChunkBytes is the size of one copied page.
	ChunkBytes int64
	// Layers, SliceBytes and GatherPages shape the layer-first buffer:
	// Layers x GatherPages x SliceBytes.
	Layers      int
	SliceBytes  int64
	GatherPages int
	// LiveObjects and ObjectPages shape the allocator churn.
	LiveObjects int
	ObjectPages int64
	// DigestPages is the slab size of the digest measurement, in pages.
	DigestPages int64
	// MinTime is how long each measurement runs at least.
	MinTime time.Duration
	// Seed drives every random choice.
	Seed uint64
	// HugeDir is a hugetlbfs mount for the slab destinations; empty means
	// none, and the slab goes to ShmDir (the note says so).
	HugeDir string
	// ShmDir holds the slab when HugeDir is empty.
	ShmDir string
	// Logger receives progress; nil discards.
	Logger *slog.Logger
}

// DefaultOptions returns the sizes `kvtier bench l2` uses.
func DefaultOptions() Options {
	return Options{
		CopyBytes:  128 << 20,
		ChunkBytes: 2 << 20,
		// 61 layers x 46 KiB: a 2.75 MiB MLA page of 512 tokens on one
		// rank (the default stack's kv payload), layer-first.
		Layers:      61,
		SliceBytes:  46 << 10,
		GatherPages: 48,
		LiveObjects: 100_000,
		ObjectPages: 64,
		DigestPages: 500_000,
		MinTime:     time.Second,
		Seed:        1,
		ShmDir:      l2hugetlb.DefaultShmDir,
	}
}

// HugePages returns how many 2 MiB pages the slab of a run needs: the copy
// destination and the gather destination.
func (o Options) HugePages() int {
	gather := int64(o.Layers) * o.SliceBytes * int64(o.GatherPages)
	return int((o.CopyBytes + gather + (2<<20 - 1)) / (2 << 20))
}

// OpenSlab opens the bench's slab (CopyBytes + the gather area) on HugeDir,
// or on ShmDir when HugeDir is empty, populated.
func OpenSlab(ctx context.Context, o Options) (*l2hugetlb.Slab, error) {
	cfg := l2hugetlb.DefaultConfig()
	cfg.Size = quantity.Size(int64(o.HugePages()) * (2 << 20))
	cfg.Name = "kvtier-bench-l2"
	cfg.Populate = true
	cfg.Stale = l2hugetlb.StaleRemove
	if o.HugeDir != "" {
		cfg.Mount = o.HugeDir
	} else {
		cfg.Mount, cfg.Fallback, cfg.ShmDir = o.ShmDir, l2hugetlb.FallbackShm, o.ShmDir
	}
	logger := o.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	env := tiers.Env{
		Logger:    logger,
		Payload:   tiers.PayloadGeometry{PageTokens: 1, Kinds: []tiers.PayloadSpec{{Name: "bench", PageBytes: o.ChunkBytes}}},
		WorldSize: 1,
		StackID:   fmt.Sprintf("bench-%d", unix.Getpid()),
	}
	return l2hugetlb.Open(ctx, env, cfg)
}

// AnonMapping returns a populated private anonymous mapping of n bytes and
// its release function.
func AnonMapping(n int64) ([]byte, func(), error) {
	m, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, nil, fmt.Errorf("anonymous mapping of %d bytes: %w", n, err)
	}
	return m, func() { _ = unix.Munmap(m) }, nil
}

// CopyPages copies src into dst chunk bytes at a time (one copy per page,
// as a batch of page copies does) and returns the bytes copied.
func CopyPages(dst, src []byte, chunk int64) int64 {
	n := min(len(dst), len(src))
	for off := 0; off < n; off += int(chunk) {
		copy(dst[off:min(off+int(chunk), n)], src[off:])
	}
	return int64(n)
}

// Gather copies page p's per-layer slices out of a layer-first buffer
// (layers x pages x slice bytes) into the contiguous dst (layers x slice),
// as one internal/memcopy batch: streaming stores, one fence.
func Gather(dst, src []byte, layers, pages, p int, slice int64) {
	s := int(slice)
	memcopy.GatherStrided(dst[:layers*s], src[p*s:], layers, s, pages*s)
}

// Scatter is Gather's inverse: contiguous src back into page p's slices.
func Scatter(dst, src []byte, layers, pages, p int, slice int64) {
	s := int(slice)
	memcopy.ScatterStrided(dst[p*s:], src[:layers*s], layers, s, pages*s)
}

// GatherCopy is Gather with one Go copy per layer slice: the kernel
// Gather replaced, kept as a reference.
func GatherCopy(dst, src []byte, layers, pages, p int, slice int64) {
	s := int(slice)
	for l := 0; l < layers; l++ {
		copy(dst[l*s:(l+1)*s], src[(l*pages+p)*s:])
	}
}

// ScatterCopy is Scatter with one Go copy per layer slice.
func ScatterCopy(dst, src []byte, layers, pages, p int, slice int64) {
	s := int(slice)
	for l := 0; l < layers; l++ {
		copy(dst[(l*pages+p)*s:(l*pages+p+1)*s], src[l*s:])
	}
}

// PageMover is Gather, Scatter, GatherCopy or ScatterCopy.
type PageMover func(dst, src []byte, layers, pages, p int, slice int64)

// GatherAll gathers every page of src into consecutive pages of dst with
// Gather and returns the bytes moved.
func GatherAll(dst, src []byte, layers, pages int, slice int64) int64 {
	return GatherAllWith(Gather, dst, src, layers, pages, slice)
}

// GatherAllWith is GatherAll with the given per-page gather.
func GatherAllWith(gather PageMover, dst, src []byte, layers, pages int, slice int64) int64 {
	per := int64(layers) * slice
	for p := 0; p < pages; p++ {
		gather(dst[int64(p)*per:int64(p+1)*per], src, layers, pages, p, slice)
	}
	return per * int64(pages)
}

// ScatterAll scatters consecutive pages of src back into the layer-first
// dst with Scatter and returns the bytes moved.
func ScatterAll(dst, src []byte, layers, pages int, slice int64) int64 {
	return ScatterAllWith(Scatter, dst, src, layers, pages, slice)
}

// ScatterAllWith is ScatterAll with the given per-page scatter.
func ScatterAllWith(scatter PageMover, dst, src []byte, layers, pages int, slice int64) int64 {
	per := int64(layers) * slice
	for p := 0; p < pages; p++ {
		scatter(dst, src[int64(p)*per:int64(p+1)*per], layers, pages, p, slice)
	}
	return per * int64(pages)
}

// Churn is an allocator holding a fixed number of live objects, with a
// reserve+release step that keeps the count: reserve a new object first
// fit, release a random live one. Releasing at random keeps the free space
// fragmented (about a fifth of the slab free, in holes across it).
type Churn struct {
	A     *placement.Allocator
	live  []placement.ObjectID
	next  placement.ObjectID
	pages int64
	r     *rand.Rand
}

// NewChurn builds an allocator of live*objPages*5/4 pages holding live
// objects of objPages pages, fragmented by releasing a random fifth of an
// initial fill. live 0 gives an empty allocator of objPages*4 pages.
func NewChurn(live int, objPages int64, seed uint64) (*Churn, error) {
	total := int64(live) * objPages * 5 / 4
	if live == 0 {
		total = objPages * 4
	}
	l := placement.Layout{Kinds: []placement.KindLayout{{Name: "kv", PageBytes: 4096, Regions: []placement.Region{{Pages: total}}}}}
	a, err := placement.New(l)
	if err != nil {
		return nil, err
	}
	c := &Churn{A: a, pages: objPages, r: rand.New(rand.NewPCG(seed, seed^0xc0ffee)), next: 1}
	fill := int(total / objPages)
	if live == 0 {
		fill = 0
	}
	for i := 0; i < fill; i++ {
		if err := a.Reserve(c.next, objPages, 1); err != nil {
			return nil, fmt.Errorf("fill object %d: %w", i, err)
		}
		if err := a.Commit(c.next); err != nil {
			return nil, err
		}
		c.live = append(c.live, c.next)
		c.next++
	}
	for len(c.live) > live {
		if err := c.releaseRandom(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *Churn) releaseRandom() error {
	i := c.r.IntN(len(c.live))
	id := c.live[i]
	c.live[i] = c.live[len(c.live)-1]
	c.live = c.live[:len(c.live)-1]
	return c.A.Release(id)
}

// Step reserves one object and releases one (a random live one, or the new
// one when there are no others).
func (c *Churn) Step() error {
	id := c.next
	c.next++
	if err := c.A.Reserve(id, c.pages, 1); err != nil {
		return fmt.Errorf("churn reserve: %w", err)
	}
	if len(c.live) == 0 {
		return c.A.Release(id)
	}
	c.live = append(c.live, id)
	return c.releaseRandom()
}

// NewDigestState builds an allocator of pages pages filled to about 90%
// with objects of 1..128 pages, a third of them then released and half of
// the rest committed: a fragmented, realistic state to digest.
func NewDigestState(pages int64, seed uint64) (*placement.Allocator, error) {
	l := placement.Layout{Kinds: []placement.KindLayout{{Name: "kv", PageBytes: 4096, Regions: []placement.Region{{Pages: pages}}}}}
	a, err := placement.New(l)
	if err != nil {
		return nil, err
	}
	r := rand.New(rand.NewPCG(seed, seed^0xd16e57))
	var ids []placement.ObjectID
	for id := placement.ObjectID(1); a.FreePages(0) > pages/10; id++ {
		n := min(1+r.Int64N(128), a.FreePages(0))
		if err := a.Reserve(id, n, 1); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		switch r.IntN(6) {
		case 0, 1:
			if err := a.Release(id); err != nil {
				return nil, err
			}
		case 2, 3, 4:
			if err := a.Commit(id); err != nil {
				return nil, err
			}
		}
	}
	return a, nil
}

// measureWall runs fn until minTime has passed and returns the units per
// second (fn returns the units it did).
func measureWall(minTime time.Duration, fn func() (int64, error)) (float64, error) {
	start := time.Now()
	return measure.Rate(func() time.Duration { return time.Since(start) }, minTime, fn)
}

// measureCPU is measureWall counted in CPU time of the measuring thread
// instead of wall time: on a machine shared with other work it shows what
// the code costs, not how often it got a core. It locks the goroutine to
// its thread for the measurement.
func measureCPU(minTime time.Duration, fn func() (int64, error)) (float64, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return measure.Rate(measure.ThreadCPU, minTime, fn)
}

// rounds is how many slices each measurement's time is cut into.
const rounds = 5

// compare measures fns in interleaved rounds (each round runs every fn for
// minTime/rounds) and returns each fn's best round, in units per second of
// the measuring thread's CPU time (cpu true) or of wall time. Interleaving
// keeps a noisy neighbour from favouring whichever fn ran first; the best
// round is the least disturbed one; CPU time leaves out the time the
// thread waited for a core on a shared machine.
func compare(minTime time.Duration, cpu bool, fns ...func() (int64, error)) ([]float64, error) {
	best := make([]float64, len(fns))
	m := measureWall
	if cpu {
		m = measureCPU
	}
	for r := 0; r < rounds; r++ {
		for i, fn := range fns {
			v, err := m(minTime/rounds, fn)
			if err != nil {
				return nil, err
			}
			best[i] = max(best[i], v)
		}
	}
	return best, nil
}

// Run performs every measurement and returns the results.
func Run(ctx context.Context, o Options) ([]benchreport.Result, error) {
	logger := o.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var out []benchreport.Result

	slab, err := OpenSlab(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("bench l2: %w", err)
	}
	defer slab.Close()
	g := slab.Geometry()
	backing := g.Backing
	whole, err := slab.Bytes(tiers.Span{Slab: 0, Offset: 0, Length: g.Slabs[0].Size})
	if err != nil {
		return nil, err
	}
	slabCopy := whole[:o.CopyBytes]
	gatherBytes := int64(o.Layers) * o.SliceBytes * int64(o.GatherPages)
	slabGather := whole[o.CopyBytes : o.CopyBytes+gatherBytes]

	// 1. Page copies: into the slab, into an anonymous mapping, between Go slices.
	logger.Info("bench l2: page copies", "bytes", o.CopyBytes, "chunk", o.ChunkBytes, "backing", backing)
	src := make([]byte, o.CopyBytes)
	for i := range src {
		src[i] = byte(i)
	}
	goDst := make([]byte, o.CopyBytes)
	copy(goDst, src) // fault it in
	anon, freeAnon, err := AnonMapping(o.CopyBytes)
	if err != nil {
		return nil, err
	}
	defer freeAnon()
	copyTo := func(dst []byte) func() (int64, error) {
		return func() (int64, error) { return CopyPages(dst, src, o.ChunkBytes), nil }
	}
	rates, err := compare(o.MinTime, true, copyTo(goDst), copyTo(anon), copyTo(slabCopy))
	if err != nil {
		return nil, err
	}
	goRate, anonRate, slabRate := rates[0], rates[1], rates[2]
	note := fmt.Sprintf("%d MiB in %d KiB pages", o.CopyBytes>>20, o.ChunkBytes>>10)
	slabNote := note
	if backing != l2hugetlb.BackingHugetlbfs {
		slabNote += "; slab on shm: hugetlbfs was not available"
	}
	out = append(out,
		benchreport.Result{Bench: "l2/copy-to-slab-" + backing, Value: slabRate / 1e9, Unit: "GB/cpu-s", Note: slabNote}.WithLimit("go slice copy", goRate/1e9),
		benchreport.Result{Bench: "l2/copy-to-anon-mmap", Value: anonRate / 1e9, Unit: "GB/cpu-s", Note: note}.WithLimit("go slice copy", goRate/1e9),
		benchreport.Result{Bench: "l2/copy-go-slices", Value: goRate / 1e9, Unit: "GB/cpu-s", Note: note + "; the reference"},
	)
	goDst, src = nil, nil

	// 2. Gather/scatter of per-layer slices vs one copy of the same bytes.
	logger.Info("bench l2: gather/scatter", "layers", o.Layers, "slice", o.SliceBytes, "pages", o.GatherPages)
	layerFirst := make([]byte, gatherBytes)
	for i := range layerFirst {
		layerFirst[i] = byte(i * 3)
	}
	rates, err = compare(o.MinTime, true,
		func() (int64, error) { return int64(copy(slabGather, layerFirst)), nil },
		func() (int64, error) { return CopyPages(slabGather, layerFirst, o.SliceBytes), nil },
		func() (int64, error) {
			return GatherAll(slabGather, layerFirst, o.Layers, o.GatherPages, o.SliceBytes), nil
		},
		func() (int64, error) {
			return ScatterAll(layerFirst, slabGather, o.Layers, o.GatherPages, o.SliceBytes), nil
		},
		func() (int64, error) {
			return GatherAllWith(GatherCopy, slabGather, layerFirst, o.Layers, o.GatherPages, o.SliceBytes), nil
		},
		func() (int64, error) {
			return ScatterAllWith(ScatterCopy, layerFirst, slabGather, o.Layers, o.GatherPages, o.SliceBytes), nil
		})
	if err != nil {
		return nil, err
	}
	oneRate, chunkRate, gRate, sRate, gCopyRate, sCopyRate := rates[0], rates[1], rates[2], rates[3], rates[4], rates[5]
	gNote := fmt.Sprintf("%d layers x %d KiB slices, %d pages, slab on %s", o.Layers, o.SliceBytes>>10, o.GatherPages, backing)
	kNote := fmt.Sprintf("; internal/memcopy %s streaming stores", memcopy.Kernel())
	out = append(out,
		benchreport.Result{Bench: "l2/gather-layers", Value: gRate / 1e9, Unit: "GB/cpu-s", Target: 0.8, Note: gNote + kNote + "; target is the ratio"}.WithLimit("one copy of the same bytes", oneRate/1e9),
		benchreport.Result{Bench: "l2/scatter-layers", Value: sRate / 1e9, Unit: "GB/cpu-s", Target: 0.8, Note: gNote + kNote + "; target is the ratio"}.WithLimit("one copy of the same bytes", oneRate/1e9),
		// The per-slice copy() kernels Gather and Scatter replaced, so the
		// gain of streaming stays visible.
		benchreport.Result{Bench: "l2/gather-layers-copy", Value: gCopyRate / 1e9, Unit: "GB/cpu-s", Note: gNote + "; one Go copy per slice"}.WithLimit("one copy of the same bytes", oneRate/1e9),
		benchreport.Result{Bench: "l2/scatter-layers-copy", Value: sCopyRate / 1e9, Unit: "GB/cpu-s", Note: gNote + "; one Go copy per slice"}.WithLimit("one copy of the same bytes", oneRate/1e9),
		// NB: Go's copy switches to non-temporal stores from 1 MiB up, which
		// a per-layer slice copy never reaches; this reference copies the
		// same bytes sequentially in slice-sized pieces, to tell that cost
		// apart from the cost of striding.
		benchreport.Result{Bench: "l2/gather-layers-vs-chunked", Value: gCopyRate / 1e9, Unit: "GB/cpu-s", Note: gNote + "; one Go copy per slice; limit copies sequentially in slice-sized pieces"}.WithLimit("sequential slice-sized copies", chunkRate/1e9),
	)
	layerFirst = nil
	_ = layerFirst

	// 3. Allocator reserve+release with 100k live objects.
	logger.Info("bench l2: allocator churn", "live", o.LiveObjects, "object_pages", o.ObjectPages)
	churn, err := NewChurn(o.LiveObjects, o.ObjectPages, o.Seed)
	if err != nil {
		return nil, err
	}
	empty, err := NewChurn(0, o.ObjectPages, o.Seed)
	if err != nil {
		return nil, err
	}
	steps := func(c *Churn) func() (int64, error) {
		return func() (int64, error) {
			for i := 0; i < 1024; i++ {
				if err := c.Step(); err != nil {
					return 0, err
				}
			}
			return 1024, nil
		}
	}
	rates, err = compare(o.MinTime, false, steps(empty), steps(churn))
	if err != nil {
		return nil, err
	}
	emptyRate, liveRate := rates[0], rates[1]
	st := churn.A.Stats()
	out = append(out, benchreport.Result{
		Bench: "l2/alloc-reserve-release", Value: liveRate, Unit: "pairs/s", Target: 1e6,
		Note: fmt.Sprintf("%d-page objects, %d live, %d free ranges; wall clock; target is the value", o.ObjectPages, st.Objects, st.FreeRanges[0]),
	}.WithLimit("same with no other live object", emptyRate))
	rates, err = compare(o.MinTime, true, steps(empty), steps(churn))
	if err != nil {
		return nil, err
	}
	emptyCPU, cpuRate := rates[0], rates[1]
	st = churn.A.Stats()
	out = append(out, benchreport.Result{
		Bench: "l2/alloc-reserve-release-cpu", Value: cpuRate, Unit: "pairs/cpu-s", Target: 1e6,
		Note: fmt.Sprintf("as above per CPU-second of the measuring thread (%d live, %d free ranges at the end); target is the value", st.Objects, st.FreeRanges[0]),
	}.WithLimit("same with no other live object", emptyCPU))
	churn, empty = nil, nil
	_, _ = churn, empty

	// 4. Digest of a 500k-page slab vs SHA-256 of its canonical bytes.
	logger.Info("bench l2: digest", "pages", o.DigestPages)
	a, err := NewDigestState(o.DigestPages, o.Seed)
	if err != nil {
		return nil, err
	}
	state := a.AppendState(nil)
	var sink [32]byte
	rates, err = compare(o.MinTime, true,
		func() (int64, error) { sink = a.Digest(); return 1, nil },
		func() (int64, error) { sink = sha256.Sum256(state); return 1, nil })
	if err != nil {
		return nil, err
	}
	digRate, hashRate := rates[0], rates[1]
	_ = sink
	ds := a.Stats()
	r := benchreport.Result{
		Bench: "l2/digest", Value: 1e3 / digRate, Unit: "cpu-ms",
		Note: fmt.Sprintf("%d pages, %d objects, %d free ranges, %d canonical bytes; lower is better, ratio = limit/value", o.DigestPages, ds.Objects, ds.FreeRanges[0], len(state)),
	}
	r.Limit, r.LimitName = 1e3/hashRate, "sha256 of the canonical bytes alone"
	r.Ratio = r.Limit / r.Value
	out = append(out, r)
	return out, nil
}

// slabSpan is the whole of slab 0.
func slabSpan(s *l2hugetlb.Slab) tiers.Span {
	g := s.Geometry()
	return tiers.Span{Slab: 0, Offset: 0, Length: g.Slabs[0].Size}
}

package l3disk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/lmdb"
	"github.com/kvtier/kvtier/internal/measure"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// BenchmarkRebuild measures the index rebuild of a cold start load whose
// index is gone (every slot read whole, header and payload CRC verified,
// one index entry put per page) against a raw read of the same slab files
// with the same I/O (O_DIRECT where the file system allows it, 8 MiB
// chunks, Depth in flight) in the same run, alternating, and reports the
// median of each and their ratio. The slabs are KVTIER_REBUILD_MIB MiB of
// 20,000-byte pages (default 256), every slot written; the index is LMDB
// with full sync, as in production.
//
//	go test -run '^$' -bench BenchmarkRebuild -benchtime 1x ./tiers/l3disk/
func BenchmarkRebuild(b *testing.B) {
	mib := int64(256)
	if v := os.Getenv("KVTIER_REBUILD_MIB"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			b.Fatalf("KVTIER_REBUILD_MIB=%q: want a positive number", v)
		}
		mib = n
	}
	geom := tiers.PayloadGeometry{PageTokens: 16, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: 20000}}}
	slots := mib << 20 / SlotBytes(20000)
	base := b.TempDir()
	ixOpen := indexOpener{"lmdb-full-sync", func(t testing.TB, dir string) indexes.Index {
		cfg := lmdb.DefaultConfig()
		cfg.Dir = dir
		cfg.MapSizeBytes = 1 << 30
		ix, err := lmdb.Open(context.Background(), indexes.Env{Logger: testLogger(t), Dir: dir}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return ix
	}}
	r := &rig{t: b, dir: filepath.Join(base, "disk0"), ixDir: filepath.Join(base, "index"), ixOpen: ixOpen, geom: geom, fs: diskfs.OS{}, slabCap: 256}
	r.cfg = testConfig(r.dir, slots)
	r.cfg.Depth = 8
	r.slab = tiertest.NewHeapSlab(r.slabCap * r.pageSlot())
	r.open(tiers.ColdStartClear)
	for i := int64(0); i < slots; i += 256 {
		n := min(256, slots-i)
		pages := makePages(uint64(i)+1, int(n), 0, geom)
		for j, e := range r.put(pages, 0) {
			if e != nil {
				b.Fatalf("put page %d: %v", i+int64(j), e)
			}
		}
	}
	direct := r.store.Direct()
	// NB: GC keeps occupancy below gc_start; the rebuild also keeps the
	// pages GC reclaimed whose slots were not reused (valid, unindexed).
	want := r.store.Stats().Pages
	path := r.store.SlabPaths()[0]
	r.close()

	const rounds = 3
	var raw, seq, rebuild, load, verify, cpu []float64 // seconds
	var kept int64
	var bytes int64
	for range b.N {
		for range rounds {
			// The limit of a round is the fastest raw read of three
			// shapes: the rebuild's own I/O (scanReaders streams of
			// scanChunk), Depth streams of 8 MiB, one stream of 8 MiB.
			var best time.Duration
			for i, sh := range []struct{ depth, chunk int }{{min(scanReaders, r.cfg.Depth), scanChunk}, {r.cfg.Depth, 8 << 20}, {1, 8 << 20}} {
				n, d, err := rawRead(path, r.cfg.ODirect, sh.depth, sh.chunk)
				if err != nil {
					b.Fatal(err)
				}
				if i == 0 || d < best {
					best = d
				}
				if sh.depth == 1 {
					seq = append(seq, d.Seconds())
				}
				bytes = n
			}
			raw = append(raw, best.Seconds())
			vd, err := verifyOnly(path, r.cfg.ODirect, r.cfg.Depth)
			if err != nil {
				b.Fatal(err)
			}
			verify = append(verify, vd.Seconds())
			if err := os.RemoveAll(r.ixDir); err != nil {
				b.Fatal(err)
			}
			start, cpu0 := time.Now(), measure.ProcessCPU()
			st := r.open(tiers.ColdStartLoad)
			load = append(load, time.Since(start).Seconds())
			cpu = append(cpu, (measure.ProcessCPU() - cpu0).Seconds())
			rc := st.Rebuilt()
			rebuild = append(rebuild, rc.Elapsed.Seconds())
			kept = rc.Kept
			r.close()
			if kept < want {
				b.Fatalf("rebuild kept %d pages of %d", kept, want)
			}
		}
	}
	gib := float64(bytes) / (1 << 30)
	mr, mb, ml, mv := measure.Median(raw), measure.Median(rebuild), measure.Median(load), measure.Median(verify)
	ms, mc := measure.Median(seq), measure.Median(cpu)
	b.ReportMetric(mr/gib, "raw-s/GiB")
	b.ReportMetric(mb/gib, "rebuild-s/GiB")
	b.ReportMetric(ml/gib, "load-s/GiB")
	b.ReportMetric(mv/gib, "verify-s/GiB")
	b.ReportMetric(mr/mb, "rebuild/raw-speed")
	b.ReportMetric(ms/mb, "rebuild/seq-speed")
	b.ReportMetric(mc/gib, "load-cpu-s/GiB")
	b.Logf("%d MiB slab, %d of %d pages kept, o_direct %v; median of %d: sequential read (1 stream) %.3fs (%.2f GiB/s), best raw read (%d streams of 8 MiB, %d of %d MiB, 1 of 8 MiB; buffers mapped before the clock) %.3fs (%.2f GiB/s), read+verify only %.3fs (%.2f GiB/s), rebuild %.3fs (%.2f GiB/s), whole open with load %.3fs using %.3fs CPU; rebuild speed %.2fx the sequential read, %.2fx the best raw read",
		bytes>>20, kept, want, direct, len(raw), ms, gib/ms, r.cfg.Depth, min(scanReaders, r.cfg.Depth), scanChunk>>20, mr, gib/mr, mv, gib/mv, mb, gib/mb, ml, mc, ms/mb, mr/mb)
}

// rawRead reads a slab file whole in pieces of chunk bytes, depth in
// flight, with the I/O mode the store uses, and returns the bytes and the
// time. Its buffers are mapped before the clock starts, as fio's are.
func rawRead(path, mode string, depth, chunk int) (int64, time.Duration, error) {
	fs := diskfs.OS{}
	f, err := fs.OpenFile(path, diskfs.OpenOptions{Direct: mode != ODirectOff})
	if errors.Is(err, diskfs.ErrDirectRefused) && mode == ODirectAuto {
		f, err = fs.OpenFile(path, diskfs.OpenOptions{})
	}
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return 0, 0, err
	}
	bufs := make([]*diskfs.AlignedBuffer, depth)
	for w := range bufs {
		if bufs[w], err = diskfs.NewAlignedBuffer(chunk); err != nil {
			return 0, 0, err
		}
		defer func() { _ = bufs[w].Free() }()
		clear(bufs[w].Bytes()) // fault it in before the clock starts
	}
	start := time.Now()
	var (
		next int64 = superblockSize
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs = make([]error, depth)
	)
	for w := range depth {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				off := next
				next += int64(chunk)
				mu.Unlock()
				if off >= size {
					return
				}
				n := min(int64(chunk), size-off)
				if _, err := f.ReadAt(bufs[w].Bytes()[:n], off); err != nil {
					errs[w] = fmt.Errorf("raw read: %w", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return size - superblockSize, time.Since(start), errors.Join(errs...)
}

// verifyOnly times verifyFile (read and verify every slot, no index).
func verifyOnly(path, mode string, depth int) (time.Duration, error) {
	f, _, err := openSlabFile(diskfs.OS{}, path, superblock{}, openMode{direct: mode, anyGeometry: true})
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.close() }()
	start := time.Now()
	_, err = verifyFile(context.Background(), f, depth)
	return time.Since(start), err
}

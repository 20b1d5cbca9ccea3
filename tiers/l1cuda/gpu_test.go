//go:build cuda

// The GPU check: needs an NVIDIA GPU and libcudart; run it with
// scripts/gpu-check.sh (go test -tags cuda -run GPU -bench GPU).

package l1cuda

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l2hugetlb"
	"github.com/kvtier/kvtier/tiers/l2hugetlb/hugetest"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// gpuPayload is a production-sized page: 2.75 MiB in 61 layers would not
// divide evenly, so 64 layers of 44 KiB.
var gpuPayload = tiers.PayloadGeometry{PageTokens: 512, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: 64 * 45056}}}

// openGPUSlab opens an L2 slab of size bytes on hugetlbfs (shm where the
// kernel refuses, said in the log).
func openGPUSlab(t testing.TB, size int64, payload tiers.PayloadGeometry) tiers.Slab {
	t.Helper()
	b := hugetest.Setup(t, int((size+(2<<20)-1)/(2<<20))+1)
	cfg := l2hugetlb.DefaultConfig()
	setBytes(&cfg.Size, size)
	cfg.Name = "gpucheck"
	if b.Kind == hugetest.BackingHugetlbfs {
		cfg.Mount = b.Dir
	} else {
		cfg.Fallback = l2hugetlb.FallbackShm
		cfg.ShmDir = b.Dir
		cfg.Mount = b.Dir + "/no-hugetlbfs"
	}
	env := tiers.Env{Logger: slog.Default(), Payload: payload, WorldSize: 1, StackID: "gpucheck"}
	s, err := l2hugetlb.Open(context.Background(), env, cfg)
	if err != nil {
		t.Fatalf("open the L2 slab: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	t.Logf("L2 slab: %s, %d bytes", s.Geometry().Backing, size)
	return s
}

func TestGPUPoolConformance(t *testing.T) {
	tiertest.RunPool(t, tiertest.PoolHarness{
		Payload: testPayload,
		Open: func(t *testing.T) (tiers.Pool, tiers.Slab) {
			slab := openGPUSlab(t, 2*tiertest.PoolPages*testPayload.Kinds[0].PageBytes, testPayload)
			p, err := OpenCUDA(testEnv(slab), CUDAConfig{Pages: tiertest.PoolPages, Layers: 4, RegisterCeiling: DefaultRegisterCeiling})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			return p, slab
		},
	})
}

// setBytes sets a size field of a module config, whatever its named
// integer type.
func setBytes[T ~int64](dst *T, v int64) { *dst = T(v) }

// TestGPURegisterPieces pins a slab in 2 MiB pieces and checks that a
// copy straddling two pieces is refused while others run.
func TestGPURegisterPieces(t *testing.T) {
	slab := openGPUSlab(t, 8<<20, testPayload)
	p, err := OpenCUDA(testEnv(slab), CUDAConfig{Pages: 8, Layers: 4, RegisterCeiling: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if len(p.regs) < 4 {
		t.Fatalf("%d registrations for 8 MiB at a 2 MiB ceiling", len(p.regs))
	}
	size := testPayload.Kinds[0].PageBytes
	straddle := tiers.PoolCopy{Page: 0, Kind: 0, Span: tiers.Span{Offset: (2 << 20) - size/2, Length: size}}
	if _, err := p.CopyToSlab(context.Background(), []tiers.PoolCopy{straddle}); err == nil {
		t.Fatal("a copy straddling two registrations was accepted")
	}
}

// BenchmarkGPUCopy moves 64 pages of 2.75 MiB each way through the cuda
// pool (every byte verified) and the same bytes with cudaMemcpy from
// memory allocated by cudaMallocHost, in the same run: the limit.
func BenchmarkGPUCopy(b *testing.B) {
	const pages = 64
	size := gpuPayload.Kinds[0].PageBytes
	slab := openGPUSlab(b, 2*pages*size, gpuPayload)
	p, err := OpenCUDA(tiers.Env{Logger: slog.Default(), Payload: gpuPayload, WorldSize: 1, Slab: slab},
		CUDAConfig{Pages: pages, Layers: 64, RegisterCeiling: DefaultRegisterCeiling})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	in := make([]tiers.PoolCopy, pages)
	out := make([]tiers.PoolCopy, pages)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range pages {
		in[i] = tiers.PoolCopy{Page: i, Kind: 0, Span: tiers.Span{Offset: int64(i) * size, Length: size}}
		out[i] = tiers.PoolCopy{Page: i, Kind: 0, Span: tiers.Span{Offset: int64(pages+i) * size, Length: size}}
		buf, _ := slab.Bytes(in[i].Span)
		for j := range buf {
			buf[j] = byte(rng.Uint32())
		}
	}
	run := func(toSlab bool, batch []tiers.PoolCopy) time.Duration { return timeBatch(b, p, toSlab, batch) }
	var h2d, d2h time.Duration
	for range max(b.N, 5) {
		h2d += run(false, in)
		d2h += run(true, out)
	}
	for i := range pages {
		a, _ := slab.Bytes(in[i].Span)
		c, _ := slab.Bytes(out[i].Span)
		if string(a) != string(c) {
			b.Fatalf("page %d came back with different bytes", i)
		}
	}
	// The limit: plain cudaMemcpy of the same bytes from pinned memory to
	// device memory and back.
	rt := p.rt
	total := uintptr(pages * size)
	var host unsafe.Pointer
	if err := rt.check("cudaMallocHost", rt.mallocHost(&host, total)); err != nil {
		b.Fatal(err)
	}
	defer rt.freeHost(host)
	var dev uintptr
	if err := rt.check("cudaMalloc", rt.malloc(&dev, total)); err != nil {
		b.Fatal(err)
	}
	defer rt.free(dev)
	var rawH2D, rawD2H time.Duration
	for range max(b.N, 5) {
		s := time.Now()
		if err := rt.check("cudaMemcpy", rt.memcpy(dev, uintptr(host), total, cudaMemcpyHostToDevice)); err != nil {
			b.Fatal(err)
		}
		rawH2D += time.Since(s)
		s = time.Now()
		if err := rt.check("cudaMemcpy", rt.memcpy(uintptr(host), dev, total, cudaMemcpyDeviceToHost)); err != nil {
			b.Fatal(err)
		}
		rawD2H += time.Since(s)
	}
	gbps := func(d time.Duration) float64 { return float64(max(b.N, 5)) * float64(total) / d.Seconds() / 1e9 }
	b.ReportMetric(gbps(h2d), "h2d-GB/s")
	b.ReportMetric(gbps(d2h), "d2h-GB/s")
	b.ReportMetric(gbps(rawH2D), "raw-h2d-GB/s")
	b.ReportMetric(gbps(rawD2H), "raw-d2h-GB/s")
	b.ReportMetric(gbps(h2d)/gbps(rawH2D), "h2d-ratio")
	b.ReportMetric(gbps(d2h)/gbps(rawD2H), "d2h-ratio")
	fmt.Printf("gpu-check: pool h2d %.1f GB/s (%.2fx cudaMemcpy %.1f), d2h %.1f GB/s (%.2fx cudaMemcpy %.1f), %d pages of %d bytes, every byte verified\n",
		gbps(h2d), gbps(h2d)/gbps(rawH2D), gbps(rawH2D), gbps(d2h), gbps(d2h)/gbps(rawD2H), gbps(rawD2H), pages, size)
}

package memcopy

import "testing"

// The benchmarks move one L2 page set as `kvtier bench l2` does: 48 pages
// of 61 layers x 46 KiB, layer-first on one side (131 MiB each side).
const (
	benchLayers = 61
	benchSlice  = 46 << 10
	benchPages  = 48
)

func benchBuffers(b *testing.B) (layerFirst, packed []byte) {
	n := benchLayers * benchSlice * benchPages
	layerFirst, packed = make([]byte, n), make([]byte, n)
	for i := range layerFirst {
		layerFirst[i] = byte(i * 3)
	}
	copy(packed, layerFirst)
	b.SetBytes(int64(n))
	b.ResetTimer()
	return layerFirst, packed
}

// BenchmarkOneCopy is the limit: one copy of the same bytes.
func BenchmarkOneCopy(b *testing.B) {
	lf, pk := benchBuffers(b)
	for b.Loop() {
		copy(pk, lf)
	}
}

// BenchmarkGatherCopyLoop gathers with a copy per slice, the old way.
func BenchmarkGatherCopyLoop(b *testing.B) {
	lf, pk := benchBuffers(b)
	per := benchLayers * benchSlice
	for b.Loop() {
		for p := 0; p < benchPages; p++ {
			gatherRef(pk[p*per:(p+1)*per], lf[p*benchSlice:], benchLayers, benchSlice, benchPages*benchSlice)
		}
	}
}

// BenchmarkGatherStrided gathers with streaming stores.
func BenchmarkGatherStrided(b *testing.B) {
	lf, pk := benchBuffers(b)
	per := benchLayers * benchSlice
	for b.Loop() {
		for p := 0; p < benchPages; p++ {
			GatherStrided(pk[p*per:(p+1)*per], lf[p*benchSlice:], benchLayers, benchSlice, benchPages*benchSlice)
		}
	}
}

// BenchmarkScatterStrided scatters with streaming stores.
func BenchmarkScatterStrided(b *testing.B) {
	lf, pk := benchBuffers(b)
	per := benchLayers * benchSlice
	for b.Loop() {
		for p := 0; p < benchPages; p++ {
			ScatterStrided(lf[p*benchSlice:], pk[p*per:(p+1)*per], benchLayers, benchSlice, benchPages*benchSlice)
		}
	}
}

// BenchmarkCopy46K compares one 46 KiB slice copy, streamed and plain,
// cycling through the whole buffer so the destination is not cached.
func BenchmarkCopy46K(b *testing.B) {
	for _, tc := range []struct {
		name string
		fn   func(dst, src []byte) int
	}{{"copy", func(d, s []byte) int { return copy(d, s) }}, {"memcopy", Copy}} {
		b.Run(tc.name, func(b *testing.B) {
			lf, pk := benchBuffers(b)
			b.SetBytes(benchSlice)
			off := 0
			for b.Loop() {
				tc.fn(pk[off:off+benchSlice], lf[off:off+benchSlice])
				off += benchSlice
				if off+benchSlice > len(pk) {
					off = 0
				}
			}
		})
	}
}

// BenchmarkGatherKernels gathers with each kernel of the build, plain copy
// included, to compare SSE2 with AVX2 streaming.
func BenchmarkGatherKernels(b *testing.B) {
	for _, k := range kernels() {
		b.Run(k.name, func(b *testing.B) {
			lf, pk := benchBuffers(b)
			per := benchLayers * benchSlice
			for b.Loop() {
				for p := 0; p < benchPages; p++ {
					gatherWith(&k, pk[p*per:(p+1)*per], lf[p*benchSlice:], benchLayers, benchSlice, benchPages*benchSlice)
				}
			}
		})
	}
}

package memcopy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// guard is how many bytes around each destination the tests check are
// left alone.
const guard = 256

// buffers returns a source holding n pseudo-random bytes at offset srcOff
// of its allocation and a destination of n bytes at dstOff, both
// surrounded by guard bytes: the allocations are large, so the Go heap
// page-aligns them and the offsets set the alignment.
func buffers(r *rand.Rand, n, srcOff, dstOff int) (src, dst, dstAll []byte, dstAt int) {
	srcAll := make([]byte, srcOff+n+guard)
	fill(r, srcAll)
	dstAll = make([]byte, guard+dstOff+n+guard)
	fill(r, dstAll)
	dstAt = guard + dstOff
	return srcAll[srcOff : srcOff+n], dstAll[dstAt : dstAt+n], dstAll, dstAt
}

// fill sets b to pseudo-random bytes from r.
func fill(r *rand.Rand, b []byte) {
	for len(b) >= 8 {
		binary.LittleEndian.PutUint64(b, r.Uint64())
		b = b[8:]
	}
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

// expect returns what dstAll holds after copying src to its window at
// dstAt with Go's copy.
func expect(dstAll []byte, dstAt int, src []byte) []byte {
	want := bytes.Clone(dstAll)
	copy(want[dstAt:], src)
	return want
}

// firstDiff describes the first difference of got and want.
func firstDiff(got, want []byte) string {
	for i := range want {
		if got[i] != want[i] {
			return fmt.Sprintf("byte %d is %#x, want %#x", i, got[i], want[i])
		}
	}
	return "no difference"
}

// TestStreamHeadsAndTails runs the streaming path itself (below the
// threshold Copy would not take it) over every size 0..300 and every
// destination alignment of a cache line, for every kernel of the build.
func TestStreamHeadsAndTails(t *testing.T) {
	const seed = 1
	r := rand.New(rand.NewPCG(seed, seed))
	for _, k := range kernels() {
		if k.body == nil {
			continue
		}
		t.Run(k.name, func(t *testing.T) {
			for n := 0; n <= 300; n++ {
				for dstOff := 0; dstOff < align; dstOff++ {
					for _, srcOff := range []int{0, 1, 8, 33, 63} {
						src, dst, all, at := buffers(r, n, srcOff, dstOff)
						want := expect(all, at, src)
						stream(&k, dst, src)
						k.fence()
						if !bytes.Equal(all, want) {
							t.Fatalf("seed %d: %d bytes, dst offset %d, src offset %d: %s (guard %d)", seed, n, dstOff, srcOff, firstDiff(all, want), guard)
						}
					}
				}
			}
		})
	}
}

// TestCopy compares Copy with copy for sizes around the streaming
// threshold and large ones, every destination alignment and several
// source alignments, through every kernel of the build (plain is the
// fallback path), and through the package's own Copy.
func TestCopy(t *testing.T) {
	const seed = 2
	sizes := []int{0, 1, 127, StreamThreshold - 1, StreamThreshold, StreamThreshold + 1, StreamThreshold + 127, 46 << 10, 100_003, 1 << 20}
	r := rand.New(rand.NewPCG(seed, seed))
	ks := kernels()
	for _, k := range append(ks, kernel{name: "active"}) {
		t.Run(k.name, func(t *testing.T) {
			for _, n := range sizes {
				for dstOff := 0; dstOff < align; dstOff += 1 + n%7 {
					for _, srcOff := range []int{0, 5, 32} {
						for _, short := range []string{"", "dst", "src"} {
							src, dst, all, at := buffers(r, n, srcOff, dstOff)
							want := expect(all, at, src)
							switch short {
							case "dst":
								dst = dst[:n/2]
								want = expect(all, at, src[:n/2])
							case "src":
								src = src[:n/2]
								want = expect(all, at, src)
							}
							var got int
							if k.name == "active" {
								got = Copy(dst, src)
							} else {
								got = copyWith(&k, dst, src)
							}
							if wantN := min(len(dst), len(src)); got != wantN {
								t.Fatalf("seed %d: %d bytes (short %q): returned %d, want %d", seed, n, short, got, wantN)
							}
							if !bytes.Equal(all, want) {
								t.Fatalf("seed %d: %d bytes, dst offset %d, src offset %d, short %q: %s", seed, n, dstOff, srcOff, short, firstDiff(all, want))
							}
						}
					}
				}
			}
		})
	}
}

// TestCopyOverlap checks overlapping buffers get copy's (memmove's)
// result, both directions, at streaming sizes.
func TestCopyOverlap(t *testing.T) {
	const n = 3 * StreamThreshold
	for _, shift := range []int{-4096, -65, -1, 0, 1, 64, 4096, StreamThreshold} {
		for _, k := range kernels() {
			buf := make([]byte, n+2*StreamThreshold)
			for i := range buf {
				buf[i] = byte(i * 7)
			}
			want := bytes.Clone(buf)
			base := StreamThreshold
			copy(want[base+shift:base+shift+n], want[base:base+n])
			if got := copyWith(&k, buf[base+shift:base+shift+n], buf[base:base+n]); got != n {
				t.Fatalf("%s shift %d: returned %d, want %d", k.name, shift, got, n)
			}
			if !bytes.Equal(buf, want) {
				t.Fatalf("%s shift %d: %s", k.name, shift, firstDiff(buf, want))
			}
		}
	}
}

// gatherRef and scatterRef are the oracles: a loop of copy calls.
func gatherRef(dst, src []byte, n, slice, stride int) {
	for i := 0; i < n; i++ {
		copy(dst[i*slice:(i+1)*slice], src[i*stride:i*stride+slice])
	}
}

func scatterRef(dst, src []byte, n, slice, stride int) {
	for i := 0; i < n; i++ {
		copy(dst[i*stride:i*stride+slice], src[i*slice:(i+1)*slice])
	}
}

// TestGatherScatterStrided compares the strided batches with a loop of
// copy calls over geometries that stream and ones that do not, odd slice
// sizes and misaligned buffers, through every kernel and the package API.
func TestGatherScatterStrided(t *testing.T) {
	const seed = 3
	tests := []struct {
		name                 string
		n, slice, stride     int
		srcOff, dstOff, tail int
	}{
		{"empty", 0, 0, 0, 0, 0, 0},
		{"zero slices", 0, 4096, 8192, 0, 0, 0},
		{"zero-byte slices", 5, 0, 100, 0, 0, 0},
		{"one slice", 1, 20_000, 0, 3, 5, 0},
		{"stride zero", 4, 20_000, 0, 0, 9, 0},
		{"small total", 4, 1000, 3000, 0, 0, 7},
		{"small slices", 64, MinStreamSlice - 1, 1024, 1, 2, 0},
		{"layers aligned", 61, 4 << 10, 48 << 10, 0, 0, 0},
		{"layers odd", 13, 5001, 12_347, 7, 61, 3},
		{"stride equals slice", 8, 9000, 9000, 0, 31, 0},
		{"page of 61 x 46 KiB", 61, 46 << 10, 4 * (46 << 10), 46 << 10, 0, 0},
		{"min stream slice", 40, MinStreamSlice, MinStreamSlice + 64, 17, 1, 0},
	}
	r := rand.New(rand.NewPCG(seed, seed))
	for _, tc := range tests {
		for _, k := range append(kernels(), kernel{name: "active"}) {
			t.Run(tc.name+"/"+k.name, func(t *testing.T) {
				stridedLen := tc.tail
				if tc.n > 0 {
					stridedLen += (tc.n-1)*tc.stride + tc.slice
				}
				packedLen := tc.n*tc.slice + tc.tail

				// Gather: strided source, packed destination.
				src, _, all, at := buffers(r, max(stridedLen, packedLen), tc.srcOff, tc.dstOff)
				src = src[:stridedLen]
				want := bytes.Clone(all)
				gatherRef(want[at:at+packedLen], src, tc.n, tc.slice, tc.stride)
				var got int
				if k.name == "active" {
					got = GatherStrided(all[at:at+packedLen], src, tc.n, tc.slice, tc.stride)
				} else {
					got = gatherWith(&k, all[at:at+packedLen], src, tc.n, tc.slice, tc.stride)
				}
				if got != tc.n*tc.slice {
					t.Fatalf("gather returned %d, want %d", got, tc.n*tc.slice)
				}
				if !bytes.Equal(all, want) {
					t.Fatalf("seed %d: gather: %s", seed, firstDiff(all, want))
				}

				// Scatter: packed source, strided destination.
				src, _, all, at = buffers(r, max(stridedLen, packedLen), tc.srcOff, tc.dstOff)
				src = src[:packedLen]
				want = bytes.Clone(all)
				scatterRef(want[at:at+stridedLen], src, tc.n, tc.slice, tc.stride)
				if k.name == "active" {
					got = ScatterStrided(all[at:at+stridedLen], src, tc.n, tc.slice, tc.stride)
				} else {
					got = scatterWith(&k, all[at:at+stridedLen], src, tc.n, tc.slice, tc.stride)
				}
				if got != tc.n*tc.slice {
					t.Fatalf("scatter returned %d, want %d", got, tc.n*tc.slice)
				}
				if !bytes.Equal(all, want) {
					t.Fatalf("seed %d: scatter: %s", seed, firstDiff(all, want))
				}
			})
		}
	}
}

// TestScatterOverlappingSlices checks stride < slice writes slices in
// order, as the copy loop does, on the streaming path.
func TestScatterOverlappingSlices(t *testing.T) {
	const n, slice, stride = 6, 8192, 5000
	src := make([]byte, n*slice)
	for i := range src {
		src[i] = byte(i/slice + 1)
	}
	want := make([]byte, (n-1)*stride+slice)
	got := bytes.Clone(want)
	scatterRef(want, src, n, slice, stride)
	for _, k := range kernels() {
		clear(got)
		scatterWith(&k, got, src, n, slice, stride)
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: %s", k.name, firstDiff(got, want))
		}
	}
}

// TestGeometryPanics checks a batch that does not fit its buffers panics
// before writing anything, and names the operation.
func TestGeometryPanics(t *testing.T) {
	tests := []struct {
		name             string
		dst, src         int
		n, slice, stride int
		gather           bool
	}{
		{"negative n", 100, 100, -1, 10, 10, true},
		{"negative slice", 100, 100, 1, -10, 10, false},
		{"negative stride", 100, 100, 2, 10, -10, true},
		{"gather dst short", 99, 1000, 10, 10, 20, true},
		{"gather src short", 100, 189, 10, 10, 20, true},
		{"scatter dst short", 189, 100, 10, 10, 20, false},
		{"scatter src short", 1000, 99, 10, 10, 20, false},
		{"huge n", 100, 100, math.MaxInt / 2, 1 << 10, 1 << 10, true},
		{"huge stride", 1 << 20, 1 << 20, 2, 1 << 10, math.MaxInt / 2, false},
		{"stride zero src short", 40, 9, 4, 10, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst, src := make([]byte, tc.dst), make([]byte, tc.src)
			for i := range src {
				src[i] = 1
			}
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
				for i, b := range dst {
					if b != 0 {
						t.Fatalf("dst byte %d written before the panic", i)
					}
				}
			}()
			if tc.gather {
				GatherStrided(dst, src, tc.n, tc.slice, tc.stride)
			} else {
				ScatterStrided(dst, src, tc.n, tc.slice, tc.stride)
			}
		})
	}
}

// TestBoundaryFits checks geometries that exactly fit do not panic.
func TestBoundaryFits(t *testing.T) {
	if got := GatherStrided(make([]byte, 40), make([]byte, 10), 4, 10, 0); got != 40 {
		t.Fatalf("stride 0 gather returned %d", got)
	}
	dst, src := make([]byte, 100), make([]byte, 190)
	if got := GatherStrided(dst, src, 10, 10, 20); got != 100 {
		t.Fatalf("gather returned %d", got)
	}
	if got := ScatterStrided(src, dst, 10, 10, 20); got != 100 {
		t.Fatalf("scatter returned %d", got)
	}
}

// FuzzCopy compares Copy and every kernel's copy with Go's copy for
// random sizes and offsets.
func FuzzCopy(f *testing.F) {
	f.Add(uint32(0), uint8(0), uint8(0), uint64(1))
	f.Add(uint32(StreamThreshold), uint8(1), uint8(63), uint64(2))
	f.Add(uint32(46<<10+3), uint8(17), uint8(32), uint64(3))
	f.Add(uint32(300), uint8(0), uint8(1), uint64(4))
	f.Fuzz(func(t *testing.T, size uint32, srcOff, dstOff uint8, seed uint64) {
		n := int(size % (256 << 10))
		r := rand.New(rand.NewPCG(seed, seed))
		for _, k := range append(kernels(), kernel{name: "active"}) {
			src, dst, all, at := buffers(r, n, int(srcOff), int(dstOff))
			want := expect(all, at, src)
			var got int
			if k.name == "active" {
				got = Copy(dst, src)
			} else {
				got = copyWith(&k, dst, src)
				if k.body != nil {
					// The streaming path below the threshold too.
					src2, dst2, all2, at2 := buffers(r, n, int(srcOff), int(dstOff))
					want2 := expect(all2, at2, src2)
					stream(&k, dst2, src2)
					k.fence()
					if !bytes.Equal(all2, want2) {
						t.Fatalf("%s stream %d bytes, offsets %d/%d: %s", k.name, n, srcOff, dstOff, firstDiff(all2, want2))
					}
				}
			}
			if got != n {
				t.Fatalf("%s: returned %d, want %d", k.name, got, n)
			}
			if !bytes.Equal(all, want) {
				t.Fatalf("%s: %d bytes, offsets %d/%d: %s", k.name, n, srcOff, dstOff, firstDiff(all, want))
			}
		}
	})
}

//go:build amd64 && !purego

package memcopy

import "golang.org/x/sys/cpu"

// active is the kernel chosen from the CPU's features at start-up; it is
// never changed afterwards.
var active = detect()

// detect picks the widest streaming kernel the CPU supports. SSE2 is part
// of amd64, so there is always one.
func detect() kernel {
	if cpu.X86.HasAVX2 {
		return avx2
	}
	return sse2
}

var (
	avx2 = kernel{name: "avx2", body: streamAVX2, fence: sfence}
	sse2 = kernel{name: "sse2", body: streamSSE2, fence: sfence}
)

// kernels lists every kernel this build has, for the tests; those the CPU
// cannot run are left out.
func kernels() []kernel {
	ks := []kernel{plain, sse2}
	if cpu.X86.HasAVX2 {
		ks = append(ks, avx2)
	}
	return ks
}

// streamAVX2 copies n bytes from src to dst with VMOVNTDQ stores; dst is
// 32-byte aligned and n a positive multiple of 128. No fence.
//
//go:noescape
func streamAVX2(dst, src *byte, n int)

// streamSSE2 copies n bytes from src to dst with MOVNTDQ stores; dst is
// 16-byte aligned and n a positive multiple of 128. No fence.
//
//go:noescape
func streamSSE2(dst, src *byte, n int)

// sfence orders every earlier store, streaming ones included, before every
// later store.
func sfence()

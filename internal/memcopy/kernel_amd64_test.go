//go:build amd64 && !purego

package memcopy

import (
	"testing"

	"golang.org/x/sys/cpu"
)

// TestKernelChoice checks the kernel follows the CPU's features.
func TestKernelChoice(t *testing.T) {
	want := "sse2"
	if cpu.X86.HasAVX2 {
		want = "avx2"
	}
	if got := Kernel(); got != want {
		t.Fatalf("Kernel() = %q, want %q (AVX2 %v)", got, want, cpu.X86.HasAVX2)
	}
}

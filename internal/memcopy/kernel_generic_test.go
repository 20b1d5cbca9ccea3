//go:build !amd64 || purego

package memcopy

import "testing"

// TestKernelChoice checks builds without a streaming kernel use copy.
func TestKernelChoice(t *testing.T) {
	if got := Kernel(); got != "copy" {
		t.Fatalf("Kernel() = %q, want %q", got, "copy")
	}
}

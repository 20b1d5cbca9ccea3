//go:build !invariants

package radix

// checkSampled is a no-op without the invariants build tag.
func (t *Tree) checkSampled() {}

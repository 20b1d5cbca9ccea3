//go:build invariants

package radix

import "fmt"

// checkSampled runs Check after a mutating call and panics on a violation:
// a broken invariant is a bug, and failing loud with the state is the
// point of the invariants build. On a large tree it checks every
// (nodes/32+1)th call, about 32 node visits per call amortised, so a test
// replaying a whole trace stays fast; small trees are checked every call.
func (t *Tree) checkSampled() {
	every := uint64(t.byID.len()/32 + 1)
	if t.ops%every != 0 {
		return
	}
	if err := t.Check(); err != nil {
		panic(fmt.Sprintf("%v (after call %d, clock %d, %d nodes, %d pages)", err, t.ops, t.clock, t.byID.len(), t.pages))
	}
}

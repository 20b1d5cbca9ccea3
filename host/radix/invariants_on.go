//go:build invariants

package radix

import "fmt"

// checkSampled runs Check after a mutating call and panics on a violation:
// a broken invariant is a bug, and failing loud with the state is the
// point of the invariants build. On a large tree it checks every
// (nodes/512)th call, so a test replaying a whole trace stays fast.
func (t *Tree) checkSampled() {
	every := uint64(len(t.byID)/512 + 1)
	if t.ops%every != 0 {
		return
	}
	if err := t.Check(); err != nil {
		panic(fmt.Sprintf("%v (after call %d, clock %d, %d nodes, %d pages)", err, t.ops, t.clock, len(t.byID), t.pages))
	}
}

//go:build invariants || race

package l3disk

// invariantsOn enables the writer's expensive self-checks (a full slot
// pool check after every state change) in invariant and race builds.
const invariantsOn = true

// Package invariants holds the one switch for kvtier's expensive
// self-checks: full allocator and tree checks after each operation,
// read-back of index writes, strict iteration order, ack bookkeeping.
//
// Enabled is a constant, true in builds with the `invariants` tag (make
// test uses it) or with the race detector, false otherwise, so a check
// written as `if invariants.Enabled { ... }` costs nothing in production
// builds: the compiler drops the branch. The package must never hold
// state or import anything of kvtier.
package invariants

//go:build invariants || race

package badger

// invariants enables the expensive self-checks (read-back of every write
// batch inside its transaction, strict key order of Iterate). They run in
// tests (make test uses -tags invariants) and race builds, never in
// production builds.
const invariants = true

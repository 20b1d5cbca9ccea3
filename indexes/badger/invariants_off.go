//go:build !(invariants || race)

package badger

// invariants is off in production builds; see invariants_on.go.
const invariants = false

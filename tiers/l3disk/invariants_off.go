//go:build !invariants && !race

package l3disk

// invariantsOn is off in production builds; see invariants_on.go.
const invariantsOn = false

//go:build !invariants

package placement

// invariantsEnabled turns on the full state check after every operation.
const invariantsEnabled = false

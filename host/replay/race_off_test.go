//go:build !race

package replay

// raceBuild is true under -race; see race_on_test.go.
const raceBuild = false

//go:build !race

package radix

// raceBuild is true under -race; see race_on_test.go.
const raceBuild = false

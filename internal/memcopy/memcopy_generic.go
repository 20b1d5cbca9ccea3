//go:build !amd64 || purego

package memcopy

// active is the kernel of builds without a streaming kernel: copy.
var active = plain

// kernels lists every kernel this build has, for the tests.
func kernels() []kernel { return []kernel{plain} }

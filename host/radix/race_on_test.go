//go:build race

package radix

// raceBuild is true under -race, where the single-threaded, trace-sized
// checks shrink (they run in full in the plain test pass) and the time
// goes to what the race detector can find.
const raceBuild = true

package main

import (
	"os"
	"testing"
)

// TestMain runs the test binary as kvtier itself when asMainEnv is set:
// commands that start a kvtier subprocess (bench serve --shadow) start the
// test binary so.
func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

package main

import (
	"context"
	"fmt"
	"io"
)

// runBenchL2 is not built yet; its issue fills this file.
func runBenchL2(_ context.Context, _ []string, _, _ io.Writer) error {
	return fmt.Errorf("bench l2: not built yet")
}

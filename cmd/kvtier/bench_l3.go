package main

import (
	"context"
	"fmt"
	"io"
)

// runBenchL3 is not built yet; its issue fills this file.
func runBenchL3(_ context.Context, _ []string, _, _ io.Writer) error {
	return fmt.Errorf("bench l3: not built yet")
}

package main

import (
	"context"
	"fmt"
	"io"
)

// runBenchRadix is not built yet; its issue fills this file.
func runBenchRadix(_ context.Context, _ []string, _, _ io.Writer) error {
	return fmt.Errorf("bench radix: not built yet")
}

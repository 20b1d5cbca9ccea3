package main

import (
	"context"
	"fmt"
	"io"
)

// runBenchPlugin is not built yet; its issue fills this file.
func runBenchPlugin(_ context.Context, _ []string, _, _ io.Writer) error {
	return fmt.Errorf("bench plugin: not built yet")
}

package main

import (
	"context"
	"fmt"
	"io"
)

func runReplay(_ context.Context, _ []string, _, _ io.Writer) error {
	return fmt.Errorf("replay: not built yet")
}

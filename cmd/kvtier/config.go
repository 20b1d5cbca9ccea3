package main

import (
	"context"
	"fmt"
	"io"
)

func runConfig(_ context.Context, _ []string, _, _ io.Writer) error {
	return fmt.Errorf("config: not built yet")
}

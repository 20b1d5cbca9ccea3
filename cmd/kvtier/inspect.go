package main

import (
	"context"
	"fmt"
	"io"
)

func runInspect(_ context.Context, _ []string, _, _ io.Writer) error {
	return fmt.Errorf("inspect: not built yet")
}

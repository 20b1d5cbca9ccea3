package redis_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"

	goredis "github.com/redis/go-redis/v9"
)

// quietLogger drops go-redis's own log lines (dial failures while a node
// is down are expected here); -v shows them.
type quietLogger struct{ w io.Writer }

func (l quietLogger) Printf(_ context.Context, format string, v ...any) {
	fmt.Fprintf(l.w, "go-redis: "+format+"\n", v...)
}

func TestMain(m *testing.M) {
	w := io.Discard
	for _, a := range os.Args {
		if a == "-test.v=true" || a == "-test.v" {
			w = os.Stderr
		}
	}
	goredis.SetLogger(quietLogger{w})
	os.Exit(m.Run())
}

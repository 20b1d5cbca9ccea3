package replay

import (
	"context"
	"testing"
)

func TestDataSharedTracePrefix(t *testing.T) {
	tr := sharedTrace(t, "mooncake_synthetic_trace.jsonl")
	res, err := RunData(context.Background(), tr, DataConfig{Dir: t.TempDir(), Requests: 400})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", res)
	if res.WrongBytes != 0 {
		t.Fatalf("wrong bytes %d", res.WrongBytes)
	}
}

package main

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/kvtier/kvtier/workload"
)

func TestGenerateWritesProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "docs.jsonl")
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"generate", "--profile", "docs", "--seed", "4", "--requests", "300", "-o", path}, &out, &errb); err != nil {
		t.Fatalf("generate: %v (%s)", err, errb.String())
	}
	got, err := workload.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg := workload.DocsConfig(4)
	cfg.Requests = 300
	want, _ := workload.Generate(cfg)
	if len(got) != len(want) || got[299].Timestamp != want[299].Timestamp {
		t.Fatalf("generate wrote %d requests, want the docs profile's %d", len(got), len(want))
	}
	for _, args := range [][]string{{"generate", "--profile", "nope"}, {"generate", "extra"}} {
		if err := run(context.Background(), args, &out, &errb); !errors.Is(err, errUsage) {
			t.Errorf("%v: got %v, want a usage error", args, err)
		}
	}
}

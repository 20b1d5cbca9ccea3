package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/bench/pluginbench"
	"github.com/kvtier/kvtier/plugins/pluginhost"
)

func TestPluginSumAndCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts a plugin")
	}
	path, err := pluginbench.FindOrBuild(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sum, err := pluginhost.FileSHA256(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var out, errOut bytes.Buffer
	if err := run(ctx, []string{"plugin", "sum", path}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "sha256: "+sum) {
		t.Fatalf("plugin sum printed:\n%s", out.String())
	}
	out.Reset()
	if err := run(ctx, []string{"plugin", "check", "--sha256", sum, path}, &out, &errOut); err != nil {
		t.Fatalf("plugin check: %v\n%s", err, errOut.String())
	}
	for _, want := range []string{"protocol 1", "slab mapped", "byte-exact", "longest prefix: ok"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("plugin check output lacks %q:\n%s", want, out.String())
		}
	}
	// The wrong role and a wrong pin are refusals, not usage errors.
	for _, args := range [][]string{
		{"plugin", "check", "--role", "index", path},
		{"plugin", "check", "--sha256", strings.Repeat("0", 64), path},
	} {
		if err := run(ctx, args, &out, &errOut); err == nil || errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want a refusal", args, err)
		}
	}
	for _, args := range [][]string{
		{"plugin"},
		{"plugin", "frob"},
		{"plugin", "sum"},
		{"plugin", "check", "--role", "pool", path},
		{"plugin", "check", "--config", "{", path},
	} {
		if err := run(ctx, args, &out, &errOut); !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}

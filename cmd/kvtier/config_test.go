package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/host/serve"
)

func TestConfigCommand(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, config.DefaultYAML(), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("version: 1\nmodel:\n  page_tokens: 512\n  payloads:\n    - {name: kv, page_bytes: 0}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A config for kvtier serve: its placeholders, one rank and two.
	serveOne := filepath.Join(dir, "serve.yaml")
	if err := os.WriteFile(serveOne, []byte(serve.DefaultYAML()), 0o644); err != nil {
		t.Fatal(err)
	}
	serveTwo := filepath.Join(dir, "serve2.yaml")
	two := strings.Replace(serve.DefaultYAML(), "ranks: {world_size: 1, rank: 0}", "ranks: {world_size: 2, rank: {{RANK}}}", 1)
	if two == serve.DefaultYAML() {
		t.Fatal("the embedded serve stack no longer says ranks: {world_size: 1, rank: 0}")
	}
	if err := os.WriteFile(serveTwo, []byte(two), 0o644); err != nil {
		t.Fatal(err)
	}
	serveBad := filepath.Join(dir, "serve-bad.yaml")
	if err := os.WriteFile(serveBad, []byte(strings.Replace(two, "pages: 256", "pages: {{RANK}}", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	tests := []struct {
		name    string
		args    []string
		out     string // substring of stdout
		errText string // substring of the error; empty: success
		usage   bool   // error wraps errUsage
	}{
		{name: "validate good", args: []string{"validate", good}, out: "ok: 2 tiers, policy adaptive\n"},
		{name: "validate bad", args: []string{"validate", bad}, errText: bad + ":5:30: $.model.payloads[0].page_bytes: must be positive"},
		{name: "validate missing file", args: []string{"validate", filepath.Join(dir, "nope.yaml")}, errText: "nope.yaml"},
		{name: "validate no file", args: []string{"validate"}, errText: "want one FILE", usage: true},
		{name: "validate serve's stack", args: []string{"validate", "--data-dir", data, serveOne}, out: "ok: 3 tiers, policy adaptive (serve's placeholders expanded for ranks 0..0, data dir " + data + ")\n"},
		{name: "validate serve's stack, 2 ranks", args: []string{"validate", "--data-dir", data, serveTwo}, out: "(serve's placeholders expanded for ranks 0..1, data dir " + data + ")\n"},
		{name: "validate serve's stack, rank 0 bad", args: []string{"validate", "--data-dir", data, serveBad}, errText: "pages 0 outside"},
		{name: "show serve's stack", args: []string{"show", serveOne}, out: "/rank0/l3\n"},
		{name: "default", args: []string{"default"}, out: "version: 1\n"},
		{name: "default names its users", args: []string{"default"}, out: "`kvtier replay`, `kvtier doctor` and `kvtier config show` use when no\n# --config is given"},
		{name: "default says serve runs its own", args: []string{"default"}, out: "`kvtier serve` without --config does not use this file"},
		{name: "default --serve", args: []string{"default", "--serve"}, out: serve.DefaultYAML()},
		{name: "show --serve refused", args: []string{"show", "--serve"}, errText: "unknown flag: --serve", usage: true},
		{name: "show default", args: []string{"show"}, out: "write_policy: write_through\n"},
		{name: "show file", args: []string{"show", good}, out: "page_bytes: 2.75MiB\n"},
		{name: "modules", args: []string{"modules"}, out: "kvtier.policy.evictor.v1"},
		{name: "modules lists planner heap", args: []string{"modules"}, out: "planner  heap "},
		{name: "modules lists planner greedy", args: []string{"modules"}, out: "planner  greedy "},
		{name: "modules lists the planner role", args: []string{"modules"}, out: "kvtier.policy.planner.v1  -"},
		{name: "no command", args: nil, errText: "name a command", usage: true},
		{name: "unknown command", args: []string{"lint"}, errText: `unknown command "lint"`, usage: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := runConfig(context.Background(), tc.args, &stdout, &stderr)
			if tc.errText == "" {
				if err != nil {
					t.Fatalf("error: %v", err)
				}
				if !strings.Contains(stdout.String(), tc.out) {
					t.Fatalf("stdout %q does not contain %q", stdout.String(), tc.out)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.errText) {
				t.Fatalf("got error %v, want one containing %q", err, tc.errText)
			}
			if errors.Is(err, errUsage) != tc.usage {
				t.Errorf("errors.Is(err, errUsage) = %v, want %v", !tc.usage, tc.usage)
			}
		})
	}
}

// TestConfigDefaultRoundTrip checks that `kvtier config default` output
// validates, and that `show` output validates to the same stack.
func TestConfigShowRoundTrip(t *testing.T) {
	var shown bytes.Buffer
	if err := runConfig(context.Background(), []string{"show"}, &shown, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "shown.yaml")
	if err := os.WriteFile(path, shown.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	if err := runConfig(context.Background(), []string{"show", path}, &again, &bytes.Buffer{}); err != nil {
		t.Fatalf("show of show output: %v", err)
	}
	if again.String() != shown.String() {
		t.Fatalf("show is not a fixed point:\n%s\n---\n%s", shown.String(), again.String())
	}
}

// runConfig runs `kvtier config args...`.
func runConfig(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return run(ctx, append([]string{"config"}, args...), stdout, stderr)
}

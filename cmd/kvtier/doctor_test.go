package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/host/doctor"
	"github.com/kvtier/kvtier/host/serve"
)

// TestDoctorDefaultJSON runs `kvtier doctor --json` for real on the
// embedded default stack: whatever this machine's verdict, the output is
// one JSON object with every check, and the exit error agrees with ok.
func TestDoctorDefaultJSON(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"doctor", "--json"}, &stdout, &stderr)
	var rep struct {
		Checks []struct {
			Name    string         `json:"name"`
			Status  string         `json:"status"`
			Message string         `json:"message"`
			Detail  map[string]any `json:"detail"`
		} `json:"checks"`
		OK *bool `json:"ok"`
	}
	dec := json.NewDecoder(&stdout)
	dec.DisallowUnknownFields()
	if derr := dec.Decode(&rep); derr != nil {
		t.Fatalf("stdout is not the report object: %v\n%s", derr, stdout.String())
	}
	if dec.More() {
		t.Error("stdout holds more than one JSON value")
	}
	var names []string
	for _, c := range rep.Checks {
		names = append(names, c.Name)
		if !slices.Contains([]string{"pass", "warn", "fail"}, c.Status) || c.Message == "" || c.Detail == nil {
			t.Errorf("check %s: status %q, message %q, detail %v", c.Name, c.Status, c.Message, c.Detail)
		}
		t.Logf("%s %s: %s", c.Status, c.Name, c.Message)
	}
	want := []string{"hugepages", "hugetlbfs_mount", "memlock", "o_direct", "plp", "disk_free", "lmdb_map_size", "api_socket", "plugin_pins"}
	if !slices.Equal(names, want) {
		t.Errorf("checks %q, want %q", names, want)
	}
	if rep.OK == nil {
		t.Fatal("no ok field")
	}
	if *rep.OK != (err == nil) {
		t.Errorf("ok %v but run returned %v", *rep.OK, err)
	}
	if err != nil && (!errors.Is(err, errChecksFailed) || errors.Is(err, errUsage)) {
		t.Errorf("error %v: want errChecksFailed (exit 1)", err)
	}
}

// fixedMachine is the real machine with the memlock limit replaced.
type fixedMachine struct {
	doctor.OS
	memlock uint64
}

func (m fixedMachine) MemlockLimit() (uint64, error) { return m.memlock, nil }

func TestDoctorCommand(t *testing.T) {
	dir := t.TempDir()
	// A slab that falls back to shm and a plugin store whose binary is
	// absent: no L3 probes, and plugin_pins fails on any machine.
	stack := func(plugin string) string {
		return "version: 1\nmodel:\n  page_tokens: 512\n  payloads: [{name: kv, page_bytes: 2MiB}]\ntiers:\n" +
			"  - {name: l2, role: slab, use: l2hugetlb, config: {size: 4MiB, fallback: shm, mount: " + filepath.Join(dir, "nohuge") + "}}\n" + plugin +
			"api: {listen: \"127.0.0.1:9401\"}\n"
	}
	missing := filepath.Join(dir, "missing.yaml")
	if err := os.WriteFile(missing, []byte(stack("  - {name: remote, role: store, plugin: {path: "+filepath.Join(dir, "absent")+", sha256: "+strings.Repeat("ab", 32)+"}}\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	fine := filepath.Join(dir, "fine.yaml")
	if err := os.WriteFile(fine, []byte(stack("")), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("version: 1\nmodel: {page_tokens: 0}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// serve's default socket: kvtier.sock in $XDG_STATE_HOME/kvtier.
	state := filepath.Join(dir, "state")
	t.Setenv("XDG_STATE_HOME", state)
	// A live socket (something answers) and a stale one (its listener
	// gone, the file left).
	sockDir := filepath.Join(dir, "sock")
	if err := os.Mkdir(sockDir, 0o700); err != nil {
		t.Fatal(err)
	}
	live, stale := filepath.Join(sockDir, "live.sock"), filepath.Join(sockDir, "stale.sock")
	ll, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer ll.Close()
	sl, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	sl.(*net.UnixListener).SetUnlinkOnClose(false)
	sl.Close()
	// kvtier serve's embedded stack, as its --help example writes it
	// (`kvtier config default --serve`): its placeholders stand for
	// --data-dir and the rank.
	serveStack, serveData := filepath.Join(dir, "serve.yaml"), filepath.Join(dir, "data")
	if err := os.WriteFile(serveStack, []byte(serve.DefaultYAML()), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		out    []string // substrings of stdout
		err    error    // wrapped by the error; nil: success
		errMsg string
	}{
		{name: "failing plugin pin", args: []string{"--config", missing},
			out: []string{"FAIL  plugin_pins", "does not exist", "WARN  hugetlbfs_mount", "PASS  memlock", "1 fail (" + missing + ")"},
			err: errChecksFailed, errMsg: "1 of 9"},
		{name: "warnings only exit 0", args: []string{"--config", fine},
			out: []string{"WARN  hugetlbfs_mount", "PASS  plugin_pins", "0 fail"}},
		{name: "json", args: []string{"--json", "--config", missing}, out: []string{`"name": "plugin_pins"`, `"ok": false`}, err: errChecksFailed},
		{name: "serve's default socket", args: []string{"--config", fine},
			out: []string{"PASS  api_socket", "the socket " + filepath.Join(state, "kvtier", "kvtier.sock") + " is free", "serve creates it (mode 0700)"}},
		{name: "--socket free", args: []string{"--config", fine, "--socket", filepath.Join(sockDir, "new.sock")},
			out: []string{"PASS  api_socket", "the socket " + filepath.Join(sockDir, "new.sock") + " is free; its directory " + sockDir + " exists"}},
		{name: "--socket live", args: []string{"--config", fine, "--socket", live},
			out: []string{"WARN  api_socket", "a live serve answers on " + live}},
		{name: "--socket stale", args: []string{"--config", fine, "--socket", stale},
			out: []string{"PASS  api_socket", stale + " is a stale socket file (no serve answers; serve removes it at start)"}},
		{name: "bad config", args: []string{"--config", bad}, errMsg: "page_tokens"},
		{name: "serve's stack", args: []string{"--config", serveStack, "--data-dir", serveData},
			out: []string{"PASS  api_socket", "the socket " + filepath.Join(serveData, "kvtier.sock") + " is free", filepath.Join(serveData, "rank0", "l3"), "0 fail (" + serveStack + ")"}},
		{name: "extra argument", args: []string{"now"}, err: errUsage},
		{name: "unknown flag", args: []string{"--fix"}, err: errUsage},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := doctorWith(context.Background(), tt.args, &stdout, &stderr, fixedMachine{memlock: 64 << 10})
			if (err == nil) != (tt.err == nil && tt.errMsg == "") {
				t.Fatalf("error %v, want %v %q", err, tt.err, tt.errMsg)
			}
			if tt.err != nil && !errors.Is(err, tt.err) {
				t.Errorf("error %v does not wrap %v", err, tt.err)
			}
			if err != nil && !strings.Contains(err.Error(), tt.errMsg) {
				t.Errorf("error %v does not contain %q", err, tt.errMsg)
			}
			for _, o := range tt.out {
				if !strings.Contains(stdout.String(), o) {
					t.Errorf("stdout does not contain %q:\n%s", o, stdout.String())
				}
			}
		})
	}
}

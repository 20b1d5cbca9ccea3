package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReplayPlotPathRefused: a --plot prefix whose directory is missing, a
// file, or which names a directory is refused before the replay runs, and
// nothing is created.
func TestReplayPlotPathRefused(t *testing.T) {
	dir := t.TempDir()
	trace := writeTrace(t, dir)
	file := filepath.Join(dir, "afile")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, prefix, want string
	}{
		{"missing directory from the root", "/nonexistent/dir/x", "directory /nonexistent/dir does not exist"},
		{"missing directory under the temp dir", filepath.Join(dir, "a", "b", "x"), "does not exist"},
		{"directory is a file", filepath.Join(file, "x"), "is not a directory"},
		{"empty prefix", "", "empty prefix"},
		{"prefix names a directory", dir + string(filepath.Separator), "names a directory"},
		{"prefix is dot", ".", "names a directory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := runCLI(t, "replay", trace, "--sweep", "--sweep-points", "3", "--plot", c.prefix)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "--plot") {
				t.Fatalf("--plot %q: error %v, want one naming --plot and containing %q", c.prefix, err, c.want)
			}
			if !errors.Is(err, errUsage) {
				t.Errorf("--plot %q: %v is not a usage error", c.prefix, err)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused --plot created %s: %v", filepath.Join(dir, "a"), err)
	}
	if _, err := os.Stat("/nonexistent"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused --plot created /nonexistent: %v", err)
	}
}

// TestReplayPlotDefaultCreatesPlotsDir: without --plot, the sweep writes
// plots/replay-sweep.{png,svg} in the working directory, creating plots/.
func TestReplayPlotDefaultCreatesPlotsDir(t *testing.T) {
	dir := t.TempDir()
	trace := writeTrace(t, dir)
	t.Chdir(dir)
	if _, _, err := runCLI(t, "replay", trace, "--sweep", "--sweep-points", "3", "--json"); err != nil {
		t.Fatal(err)
	}
	for _, ext := range []string{".png", ".svg"} {
		if st, err := os.Stat(filepath.Join(dir, defaultPlotPrefix+ext)); err != nil || st.Size() < 1000 {
			t.Errorf("default plot %s: %v", defaultPlotPrefix+ext, err)
		}
	}
}

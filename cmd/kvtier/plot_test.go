package main

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestTokenTicks: the capacity axis labels its decades as token counts a
// person reads (10K, 1M), not 10000 or 1e+06.
func TestTokenTicks(t *testing.T) {
	tests := []struct {
		min, max float64
		want     []string
	}{
		{512, 6000, []string{"100", "1K", "10K"}},
		{1.2e4, 1.2e8, []string{"10K", "100K", "1M", "10M", "100M", "1G"}},
	}
	for _, tt := range tests {
		var got []string
		for _, tick := range (tokenTicks{}).Ticks(tt.min, tt.max) {
			if tick.Label != "" {
				got = append(got, tick.Label)
			}
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("labels over [%g, %g] = %q, want %q", tt.min, tt.max, got, tt.want)
		}
	}
}

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

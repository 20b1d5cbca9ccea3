package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// inspect runs kvtier inspect l3 with args and returns its output.
func inspect(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), append([]string{"inspect", "l3"}, args...), &out, &errOut)
	return out.String() + errOut.String(), err
}

// TestInspectL3ReadOnly checks that inspect never creates an index or a
// directory: a wrong --index, a misspelled --index-dir or --dir and an
// empty directory are refused by name, and the index kind is detected.
func TestInspectL3ReadOnly(t *testing.T) {
	base := t.TempDir()
	writeL3(t, base, 5)
	disk, ixDir := filepath.Join(base, "disk"), filepath.Join(base, "index")
	before := listDir(t, ixDir)
	if _, err := inspect(t, "--dir", disk, "--index", "lmdb", "--index-dir", ixDir); err == nil || !strings.Contains(err.Error(), "holds a badger index, not lmdb") {
		t.Fatalf("wrong --index: %v", err)
	}
	if after := listDir(t, ixDir); after != before {
		t.Fatalf("inspect changed the index directory:\n%s\nto\n%s", before, after)
	}
	typo := ixDir + "x"
	if _, err := inspect(t, "--dir", disk, "--index-dir", typo); err == nil || !strings.Contains(err.Error(), "no index in "+typo) {
		t.Fatalf("misspelled --index-dir: %v", err)
	}
	if _, err := os.Stat(typo); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("inspect created %s", typo)
	}
	if _, err := inspect(t, "--dir", disk+"x", "--index-dir", ixDir); err == nil || !strings.Contains(err.Error(), disk+"x") {
		t.Fatalf("misspelled --dir: %v", err)
	}
	empty := t.TempDir()
	if _, err := inspect(t, "--dir", empty, "--index-dir", ixDir); err == nil || !strings.Contains(err.Error(), "no slab files") {
		t.Fatalf("empty --dir: %v", err)
	}
	// Detected, not named: badger.
	if out, err := inspect(t, "--dir", disk, "--index-dir", ixDir); !errors.Is(err, errDamage) || !strings.Contains(out, "5 live") {
		t.Fatalf("detected index: %v\n%s", err, out)
	}
}

// TestInspectL3Damage plants each kind of slab damage inspect must report
// and --repair must fix.
func TestInspectL3Damage(t *testing.T) {
	cases := []struct {
		name       string
		damage     func(t *testing.T, slab, ixDir string)
		report     string // what the first pass must say
		liveAfter  string // what the pass after --repair must say
		damagedNow bool   // the pass after --repair still finds damage
	}{
		{"deleted slab", func(t *testing.T, slab, _ string) {
			if err := os.Remove(slab); err != nil {
				t.Fatal(err)
			}
			// A second file keeps the directory non-empty.
			if err := os.WriteFile(filepath.Join(filepath.Dir(slab), "kvtier-l3-t-r0-k1.slab"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "6 naming a missing or unusable slab file", "0 naming a missing", true},
		{"truncated slab", func(t *testing.T, slab, _ string) {
			if err := os.Truncate(slab, 4096+3*12288+100); err != nil {
				t.Fatal(err)
			}
		}, "truncated: ", "3 live", false},
		{"fifo in place of a slab", func(t *testing.T, slab, _ string) {
			if err := os.Rename(slab, slab+".moved"); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(slab, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file", "0 naming a missing", true},
		{"symlink in place of a slab", func(t *testing.T, slab, _ string) {
			if err := os.Rename(slab, slab+".moved"); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(slab+".moved", slab); err != nil {
				t.Fatal(err)
			}
		}, "symbolic link", "0 naming a missing", true},
		{"flipped superblock", func(t *testing.T, slab, _ string) {
			f, err := os.OpenFile(slab, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt([]byte{0x55}, 40); err != nil {
				t.Fatal(err)
			}
		}, "superblock unreadable", "5 live", false},
		{"index replaced by an empty one", func(t *testing.T, _, ixDir string) {
			if err := os.RemoveAll(ixDir); err != nil {
				t.Fatal(err)
			}
			writeEmptyBadger(t, ixDir)
		}, "names none of the 5 valid pages", "5 live", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base := t.TempDir()
			writeL3(t, base, 5)
			disk, ixDir := filepath.Join(base, "disk"), filepath.Join(base, "index")
			slab := filepath.Join(disk, "kvtier-l3-t-r0-k0.slab")
			c.damage(t, slab, ixDir)
			out, err := inspect(t, "--dir", disk, "--index-dir", ixDir)
			if !errors.Is(err, errDamage) || !strings.Contains(out, c.report) || !strings.Contains(out, "status: DAMAGED") {
				t.Fatalf("first pass: %v, want damage reporting %q:\n%s", err, c.report, out)
			}
			if out, err = inspect(t, "--dir", disk, "--index-dir", ixDir, "--repair"); !errors.Is(err, errDamage) {
				t.Fatalf("repair: %v\n%s", err, out)
			}
			out, err = inspect(t, "--dir", disk, "--index-dir", ixDir)
			if !strings.Contains(out, c.liveAfter) || errors.Is(err, errDamage) != c.damagedNow {
				t.Fatalf("after repair: %v (want damage %v), want %q:\n%s", err, c.damagedNow, c.liveAfter, out)
			}
		})
	}
}

func listDir(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range ents {
		b.WriteString(e.Name() + "\n")
	}
	return b.String()
}

// TestInspectL3DamagedIndex damages the index itself: inspect reports it
// without touching it, --repair sets it aside and rebuilds it from the
// slabs, and --rebuild-index rebuilds a healthy one on demand.
func TestInspectL3DamagedIndex(t *testing.T) {
	base := t.TempDir()
	writeL3(t, base, 5)
	disk, ixDir := filepath.Join(base, "disk"), filepath.Join(base, "index")
	// Damage every table so Badger cannot open it.
	tables, _ := filepath.Glob(filepath.Join(ixDir, "*.sst"))
	if len(tables) == 0 {
		t.Fatal("no tables")
	}
	for _, p := range tables {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for i := 100; i < len(b); i += 97 {
			b[i] ^= 0x5a
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	before := listDir(t, ixDir)
	out, err := inspect(t, "--dir", disk, "--index-dir", ixDir)
	if !errors.Is(err, errDamage) || !strings.Contains(out, "DAMAGED") {
		t.Fatalf("damaged index: %v\n%s", err, out)
	}
	if after := listDir(t, ixDir); after != before {
		t.Fatalf("a read-only inspect changed the damaged index:\n%s\nto\n%s", before, after)
	}
	out, err = inspect(t, "--dir", disk, "--index-dir", ixDir, "--repair")
	if !errors.Is(err, errDamage) || !strings.Contains(out, "rebuilt: index rebuilt from the slot headers: 5 pages kept") {
		t.Fatalf("repair: %v\n%s", err, out)
	}
	out, err = inspect(t, "--dir", disk, "--index-dir", ixDir)
	if err != nil || !strings.Contains(out, "5 live") {
		t.Fatalf("after repair: %v\n%s", err, out)
	}
	out, err = inspect(t, "--dir", disk, "--index-dir", ixDir, "--rebuild-index")
	if err != nil || !strings.Contains(out, "5 pages kept") {
		t.Fatalf("--rebuild-index: %v\n%s", err, out)
	}
	// --rebuild-index creates a missing index of the kind named.
	fresh := filepath.Join(base, "fresh")
	out, err = inspect(t, "--dir", disk, "--index", "lmdb", "--index-dir", fresh, "--rebuild-index")
	if !strings.Contains(out, "5 pages kept") {
		t.Fatalf("--rebuild-index into a new lmdb index: %v\n%s", err, out)
	}
	if out, err = inspect(t, "--dir", disk, "--index-dir", fresh); err != nil || !strings.Contains(out, "5 live") {
		t.Fatalf("the rebuilt lmdb index: %v\n%s", err, out)
	}
}

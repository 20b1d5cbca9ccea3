package l2hugetlb_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l2hugetlb"
	"github.com/kvtier/kvtier/tiers/l2hugetlb/hugetest"
)

// Child process modes: the test binary re-executes itself with
// childModeEnv set to act as a second process of the node.
const (
	childModeEnv = "KVTIER_L2_TEST_CHILD"
	childArgEnv  = "KVTIER_L2_TEST_ARG"
)

func TestMain(m *testing.M) {
	switch os.Getenv(childModeEnv) {
	case "":
		os.Exit(m.Run())
	case "attach":
		if err := childAttach(os.Getenv(childArgEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	case "crash":
		if err := childCrash(os.Getenv(childArgEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		// Exit without Close: the files and lock stay, the flock goes.
		os.Exit(0)
	default:
		fmt.Fprintln(os.Stderr, "unknown child mode")
		os.Exit(2)
	}
}

// pattern fills b with bytes derived from seed, so a reader can check them.
func pattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
}

func checkPattern(b []byte, seed byte) error {
	for i := range b {
		if want := byte(i*7) ^ seed; b[i] != want {
			return fmt.Errorf("byte %d is %#x, want %#x", i, b[i], want)
		}
	}
	return nil
}

// crossSpans are the spans the cross-process test uses: one the parent
// writes and the child checks, one the child writes and the parent checks,
// on different slab files.
func crossSpans(g tiers.SlabGeometry) (parent, child tiers.Span) {
	last := g.Slabs[len(g.Slabs)-1]
	return tiers.Span{Slab: 0, Offset: 123, Length: 5000},
		tiers.Span{Slab: last.ID, Offset: last.Size - 7000, Length: 7000}
}

func childAttach(arg string) error {
	var g tiers.SlabGeometry
	if err := json.Unmarshal([]byte(arg), &g); err != nil {
		return err
	}
	s, err := l2hugetlb.Attach(context.Background(), slog.New(slog.DiscardHandler), g)
	if err != nil {
		return err
	}
	defer s.Close()
	ps, cs := crossSpans(g)
	b, err := s.Bytes(ps)
	if err != nil {
		return err
	}
	if err := checkPattern(b, 0xA5); err != nil {
		return fmt.Errorf("reading the parent's bytes: %w", err)
	}
	b, err = s.Bytes(cs)
	if err != nil {
		return err
	}
	pattern(b, 0x3C)
	return nil
}

type crashArg struct {
	Config  l2hugetlb.Config
	StackID string
}

func childCrash(arg string) error {
	var a crashArg
	if err := json.Unmarshal([]byte(arg), &a); err != nil {
		return err
	}
	_, err := l2hugetlb.Open(context.Background(), testEnv(a.StackID, 0), a.Config)
	return err
}

func runChild(t *testing.T, mode string, arg any) {
	t.Helper()
	js, err := json.Marshal(arg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childModeEnv+"="+mode, childArgEnv+"="+string(js))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child %s: %v\n%s", mode, err, out)
	}
}

func testEnv(stackID string, rank int) tiers.Env {
	return tiers.Env{
		Logger:    slog.New(slog.DiscardHandler),
		Payload:   tiers.PayloadGeometry{PageTokens: 64, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: 4096}}},
		Rank:      rank,
		WorldSize: 2,
		StackID:   stackID,
	}
}

// backingCase is one place a slab can be created in a test.
type backingCase struct {
	name     string
	kind     string
	pageSize int64
	cfg      func(size, maxSlab quantity.Size) l2hugetlb.Config
}

// backings returns the hugetlbfs backing when the kernel grants pages (with
// pages 2 MiB pages) and always the explicit shm fallback.
func backings(t *testing.T, pages int) []backingCase {
	t.Helper()
	var out []backingCase
	if b := hugetest.Setup(t, pages); b.Kind == hugetest.BackingHugetlbfs {
		out = append(out, backingCase{"hugetlbfs", l2hugetlb.BackingHugetlbfs, 2 << 20, func(size, maxSlab quantity.Size) l2hugetlb.Config {
			c := l2hugetlb.DefaultConfig()
			c.Size, c.MaxSlab, c.Mount = size, maxSlab, b.Dir
			return c
		}})
	} else {
		t.Logf("hugetlbfs cases skipped: %s", b.Why)
	}
	shm := hugetest.ShmDir(t)
	out = append(out, backingCase{"shm", l2hugetlb.BackingShm, int64(os.Getpagesize()), func(size, maxSlab quantity.Size) l2hugetlb.Config {
		c := l2hugetlb.DefaultConfig()
		c.Size, c.MaxSlab = size, maxSlab
		c.Mount = shm // not hugetlbfs: the fallback must kick in
		c.Fallback, c.ShmDir = l2hugetlb.FallbackShm, shm
		return c
	}})
	return out
}

// TestSlabLifecycle opens a multi-file slab on each backing, checks the
// geometry, writes and reads through Bytes, refuses spans out of range,
// and checks Close removes the files.
func TestSlabLifecycle(t *testing.T) {
	for _, bc := range backings(t, 4) {
		t.Run(bc.name, func(t *testing.T) {
			page := bc.pageSize
			cfg := bc.cfg(quantity.Size(3*page), quantity.Size(max(page, 2<<20)))
			if bc.kind == l2hugetlb.BackingShm {
				cfg.Size = 6 << 20 // three files of 2 MiB at the 2 MiB cap
			}
			cfg.Populate = true
			s, err := l2hugetlb.Open(context.Background(), testEnv("stack-a", 0), cfg)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			g := s.Geometry()
			if g.Backing != bc.kind || g.PageSize != page || g.StackID != "stack-a" {
				t.Fatalf("geometry %+v: want backing %s, page size %d", g, bc.kind, page)
			}
			var total int64
			for i, f := range g.Slabs {
				if int(f.ID) != i || f.Size <= 0 || f.Size%page != 0 || f.Size > int64(cfg.MaxSlab) {
					t.Fatalf("slab file %d: %+v", i, f)
				}
				if st, err := os.Stat(f.Path); err != nil || st.Size() != f.Size {
					t.Fatalf("slab file %s: %v", f.Path, err)
				}
				total += f.Size
			}
			if len(g.Slabs) != 3 {
				t.Fatalf("%d slab files, want 3 (size %s, max_slab %s)", len(g.Slabs), cfg.Size, cfg.MaxSlab)
			}
			for _, f := range g.Slabs {
				b, err := s.Bytes(tiers.Span{Slab: f.ID, Offset: 0, Length: f.Size})
				if err != nil {
					t.Fatal(err)
				}
				pattern(b, byte(f.ID))
			}
			for _, f := range g.Slabs {
				b, _ := s.Bytes(tiers.Span{Slab: f.ID, Offset: 0, Length: f.Size})
				if err := checkPattern(b, byte(f.ID)); err != nil {
					t.Fatalf("slab %d: %v", f.ID, err)
				}
			}
			for _, bad := range []tiers.Span{
				{Slab: 3, Offset: 0, Length: 1},
				{Slab: 0, Offset: -1, Length: 1},
				{Slab: 0, Offset: 0, Length: -1},
				{Slab: 0, Offset: g.Slabs[0].Size - 1, Length: 2}, // would straddle into slab 1
				{Slab: 2, Offset: g.Slabs[2].Size + 1, Length: 0},
			} {
				if _, err := s.Bytes(bad); !errors.Is(err, tiers.ErrInvalid) {
					t.Errorf("Bytes(%+v) = %v, want ErrInvalid", bad, err)
				}
			}
			if b, err := s.Bytes(tiers.Span{Slab: 1, Offset: 10, Length: 20}); err != nil || len(b) != 20 || cap(b) != 20 {
				t.Fatalf("Bytes view: len %d cap %d err %v, want 20 20 nil", len(b), cap(b), err)
			}
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			for _, f := range g.Slabs {
				if _, err := os.Stat(f.Path); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("slab file %s still there after Close: %v", f.Path, err)
				}
			}
			if _, err := s.Bytes(tiers.Span{Length: 1}); !errors.Is(err, tiers.ErrClosed) {
				t.Errorf("Bytes after Close = %v, want ErrClosed", err)
			}
			if err := s.Close(); !errors.Is(err, tiers.ErrClosed) {
				t.Errorf("second Close = %v, want ErrClosed", err)
			}
		})
	}
}

// TestCrossProcess has a child process attach by path, read the bytes the
// parent wrote and write bytes the parent reads.
func TestCrossProcess(t *testing.T) {
	for _, bc := range backings(t, 4) {
		t.Run(bc.name, func(t *testing.T) {
			cfg := bc.cfg(quantity.Size(2*bc.pageSize), quantity.Size(bc.pageSize))
			if bc.kind == l2hugetlb.BackingShm {
				cfg.Size, cfg.MaxSlab = 4<<20, 2<<20
			}
			s, err := l2hugetlb.Open(context.Background(), testEnv("stack-x", 0), cfg)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer s.Close()
			g := s.Geometry()
			ps, cs := crossSpans(g)
			b, err := s.Bytes(ps)
			if err != nil {
				t.Fatal(err)
			}
			pattern(b, 0xA5)
			runChild(t, "attach", g)
			b, err = s.Bytes(cs)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkPattern(b, 0x3C); err != nil {
				t.Fatalf("reading the child's bytes: %v", err)
			}
		})
	}
}

// TestJoinRank checks that rank 1 of the same stack maps rank 0's memory,
// and that only the creator removes the files.
func TestJoinRank(t *testing.T) {
	for _, bc := range backings(t, 2) {
		t.Run(bc.name, func(t *testing.T) {
			cfg := bc.cfg(quantity.Size(bc.pageSize), l2hugetlb.DefaultMaxSlab)
			// Both ranks share one metrics registry, as ranks in one process do.
			reg := prometheus.NewRegistry()
			env0, env1 := testEnv("stack-j", 0), testEnv("stack-j", 1)
			env0.Registerer, env1.Registerer = reg, reg
			r0, err := l2hugetlb.Open(context.Background(), env0, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer r0.Close()
			r1, err := l2hugetlb.Open(context.Background(), env1, cfg)
			if err != nil {
				t.Fatalf("rank 1 Open: %v", err)
			}
			sp := tiers.Span{Offset: 64, Length: 100}
			b0, _ := r0.Bytes(sp)
			pattern(b0, 9)
			b1, _ := r1.Bytes(sp)
			if err := checkPattern(b1, 9); err != nil {
				t.Fatalf("rank 1 reads rank 0's bytes: %v", err)
			}
			if err := r1.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(r0.Geometry().Slabs[0].Path); err != nil {
				t.Fatalf("rank 1's Close removed the files: %v", err)
			}
			// A rank whose config disagrees is refused.
			bad := cfg
			bad.Size *= 2
			if _, err := l2hugetlb.Open(context.Background(), testEnv("stack-j", 1), bad); !errors.Is(err, tiers.ErrInvalid) {
				t.Fatalf("rank 1 with another size: %v, want ErrInvalid", err)
			}
		})
	}
}

// TestLocks checks that another stack cannot open or attach the same slab
// files, that the same stack cannot be created twice while the first is
// live, and that a different name coexists.
func TestLocks(t *testing.T) {
	for _, bc := range backings(t, 3) {
		t.Run(bc.name, func(t *testing.T) {
			cfg := bc.cfg(quantity.Size(bc.pageSize), l2hugetlb.DefaultMaxSlab)
			a, err := l2hugetlb.Open(context.Background(), testEnv("stack-a", 0), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			_, err = l2hugetlb.Open(context.Background(), testEnv("stack-b", 0), cfg)
			if !errors.Is(err, l2hugetlb.ErrLocked) || !strings.Contains(err.Error(), `live stack "stack-a"`) {
				t.Fatalf("second stack on the same files: %v, want ErrLocked naming stack-a", err)
			}
			_, err = l2hugetlb.Open(context.Background(), testEnv("stack-a", 0), cfg)
			if !errors.Is(err, l2hugetlb.ErrLocked) {
				t.Fatalf("same stack created twice: %v, want ErrLocked", err)
			}
			g := a.Geometry()
			g.StackID = "stack-b"
			if _, err := l2hugetlb.Attach(context.Background(), nil, g); !errors.Is(err, l2hugetlb.ErrLocked) {
				t.Fatalf("attach as another stack: %v, want ErrLocked", err)
			}
			other := cfg
			other.Name = "other"
			b, err := l2hugetlb.Open(context.Background(), testEnv("stack-b", 0), other)
			if err != nil {
				t.Fatalf("another name beside: %v", err)
			}
			b.Close()
			g = a.Geometry()
			g.Slabs[0].Size += g.PageSize
			if _, err := l2hugetlb.Attach(context.Background(), nil, g); !errors.Is(err, tiers.ErrInvalid) {
				t.Fatalf("attach with a wrong size: %v, want ErrInvalid", err)
			}
		})
	}
}

// TestStale leaves slab files behind with a child process that opens and
// exits without Close (a crash), then opens again under each stale policy.
func TestStale(t *testing.T) {
	for _, bc := range backings(t, 2) {
		t.Run(bc.name, func(t *testing.T) {
			cfg := bc.cfg(quantity.Size(bc.pageSize), l2hugetlb.DefaultMaxSlab)
			crash := func() {
				runChild(t, "crash", crashArg{Config: cfg, StackID: "stack-s"})
			}
			crash()
			// Attach to the dead stack's files is refused: nobody owns them.
			g := tiers.SlabGeometry{
				Slabs:    []tiers.SlabFile{{ID: 0, Path: filepath.Join(dirOf(cfg, bc), cfg.Name+"-0.slab"), Size: bc.pageSize}},
				PageSize: bc.pageSize, Backing: bc.kind, StackID: "stack-s",
			}
			if _, err := l2hugetlb.Attach(context.Background(), nil, g); !errors.Is(err, l2hugetlb.ErrStale) {
				t.Fatalf("attach to a crashed stack's files: %v, want ErrStale", err)
			}
			for _, stackID := range []string{"stack-s", "stack-new"} {
				c := cfg
				c.Stale = l2hugetlb.StaleFail
				_, err := l2hugetlb.Open(context.Background(), testEnv(stackID, 0), c)
				if !errors.Is(err, l2hugetlb.ErrStale) || !strings.Contains(err.Error(), "stale: remove") {
					t.Fatalf("%s with stale: fail: %v, want ErrStale with advice", stackID, err)
				}
			}
			for _, policy := range []l2hugetlb.Stale{l2hugetlb.StaleRemove, l2hugetlb.StaleReuse} {
				crash2 := policy == l2hugetlb.StaleReuse
				if crash2 {
					crash() // the remove case cleaned up; leave stale files again
				}
				c := cfg
				c.Stale = policy
				var logs bytes.Buffer
				env := testEnv("stack-new", 0)
				env.Logger = slog.New(slog.NewTextHandler(&logs, nil))
				s, err := l2hugetlb.Open(context.Background(), env, c)
				if err != nil {
					t.Fatalf("stale: %s: %v", policy, err)
				}
				if !strings.Contains(logs.String(), "stale slab files") {
					t.Errorf("stale: %s did not warn: %s", policy, logs.String())
				}
				b, _ := s.Bytes(tiers.Span{Length: 10})
				pattern(b, 1)
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				left, _ := filepath.Glob(filepath.Join(dirOf(cfg, bc), cfg.Name+"*"))
				if len(left) != 0 {
					t.Fatalf("stale: %s left %v after Close", policy, left)
				}
			}
		})
	}
}

func dirOf(cfg l2hugetlb.Config, bc backingCase) string {
	if bc.kind == l2hugetlb.BackingShm {
		return cfg.ShmDir
	}
	return cfg.Mount
}

// TestRefusals covers opening without hugetlbfs and without fallback, and
// (on real hugetlbfs) the capacity preflight and the fallback on a full
// mount.
func TestRefusals(t *testing.T) {
	cfg := l2hugetlb.DefaultConfig()
	cfg.Size = 4 << 20
	cfg.Mount = t.TempDir()
	_, err := l2hugetlb.Open(context.Background(), testEnv("s", 0), cfg)
	if !errors.Is(err, l2hugetlb.ErrNoHugetlbfs) || !strings.Contains(err.Error(), "mount -t hugetlbfs") || !strings.Contains(err.Error(), "fallback: shm") {
		t.Fatalf("no hugetlbfs, no fallback: %v", err)
	}

	b := hugetest.Setup(t, 2)
	if b.Kind != hugetest.BackingHugetlbfs {
		t.Logf("capacity preflight on hugetlbfs not run: %s", b.Why)
		return
	}
	cfg.Mount = b.Dir
	cfg.Size = 6 << 20 // 3 pages on a 2-page mount
	_, err = l2hugetlb.Open(context.Background(), testEnv("s", 0), cfg)
	if !errors.Is(err, l2hugetlb.ErrCapacity) || !strings.Contains(err.Error(), "need 6MiB (3 x 2MiB pages) on "+b.Dir+" but only 4MiB free") {
		t.Fatalf("over capacity: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(b.Dir, "*")); len(left) != 0 {
		t.Fatalf("a refused open left %v", left)
	}
	var logs bytes.Buffer
	env := testEnv("s", 0)
	env.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	cfg.Fallback, cfg.ShmDir = l2hugetlb.FallbackShm, hugetest.ShmDir(t)
	s, err := l2hugetlb.Open(context.Background(), env, cfg)
	if err != nil {
		t.Fatalf("full mount with fallback: %v", err)
	}
	defer s.Close()
	if s.Geometry().Backing != l2hugetlb.BackingShm || !strings.Contains(logs.String(), "NOT hugepage-backed") {
		t.Fatalf("full mount with fallback: backing %s, logs %s", s.Geometry().Backing, logs.String())
	}
}

// TestMlockAndMetrics opens with populate and mlock and a metrics
// registry, and checks the gauges come and go with the slab.
func TestMlockAndMetrics(t *testing.T) {
	bc := backings(t, 1)[0]
	cfg := bc.cfg(quantity.Size(bc.pageSize), l2hugetlb.DefaultMaxSlab)
	cfg.Populate, cfg.Mlock = true, true
	reg := prometheus.NewRegistry()
	env := testEnv("stack-m", 0)
	env.Registerer = reg
	for round := 0; round < 2; round++ {
		s, err := l2hugetlb.Open(context.Background(), env, cfg)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, mf := range mfs {
			if mf.GetName() == "kvtier_l2_slab_bytes" && mf.GetMetric()[0].GetGauge().GetValue() == float64(bc.pageSize) {
				found = true
			}
		}
		if !found {
			t.Fatalf("round %d: kvtier_l2_slab_bytes not %d in %v", round, bc.pageSize, mfs)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestConfig(t *testing.T) {
	good := l2hugetlb.DefaultConfig()
	good.Size = 64 * quantity.GiB
	tests := []struct {
		name string
		edit func(*l2hugetlb.Config)
		want string
	}{
		{"ok", func(*l2hugetlb.Config) {}, ""},
		{"no size", func(c *l2hugetlb.Config) { c.Size = 0 }, "size must be set"},
		{"relative mount", func(c *l2hugetlb.Config) { c.Mount = "huge" }, "absolute"},
		{"bad name", func(c *l2hugetlb.Config) { c.Name = "a/b" }, "name"},
		{"tiny max_slab", func(c *l2hugetlb.Config) { c.MaxSlab = quantity.MiB }, "max_slab"},
		{"bad fallback", func(c *l2hugetlb.Config) { c.Fallback = "tmpfs" }, "fallback"},
		{"bad stale", func(c *l2hugetlb.Config) { c.Stale = "keep" }, "stale"},
		{"relative shm", func(c *l2hugetlb.Config) { c.ShmDir = "shm" }, "shm_dir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			tt.edit(&c)
			err := c.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
			} else if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want an error about %s", err, tt.want)
			}
			// String round-trips through strict YAML decoding.
			var back l2hugetlb.Config
			if err := yaml.UnmarshalWithOptions([]byte(c.String()), &back, yaml.Strict()); err != nil {
				t.Fatalf("decode %s: %v", c, err)
			}
			if back != c {
				t.Fatalf("round trip of %s gave %s", c, back)
			}
		})
	}
}

func TestRegister(t *testing.T) {
	r := tiers.NewRegistry()
	if err := l2hugetlb.Register(r); err != nil {
		t.Fatal(err)
	}
	if err := l2hugetlb.Register(r); err == nil {
		t.Fatal("second Register succeeded")
	}
	cfg, err := r.NewConfig(tiers.SlabV1, "l2hugetlb")
	if err != nil {
		t.Fatal(err)
	}
	c, ok := cfg.(*l2hugetlb.Config)
	if !ok || c.Mount != l2hugetlb.DefaultMount || c.MaxSlab != l2hugetlb.DefaultMaxSlab || c.Fallback != l2hugetlb.FallbackNone || c.Stale != l2hugetlb.StaleFail {
		t.Fatalf("NewConfig = %#v", cfg)
	}
	reg, err := r.Slabs.Lookup(tiers.SlabV1, "l2hugetlb")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Factory(context.Background(), testEnv("s", 0), struct{}{}); !errors.Is(err, tiers.ErrInvalid) {
		t.Fatalf("factory with a foreign config: %v", err)
	}
	// Through the factory, on the shm fallback.
	c.Size, c.Mount, c.Fallback, c.ShmDir = 64<<10, t.TempDir(), l2hugetlb.FallbackShm, hugetest.ShmDir(t)
	s, err := reg.Factory(context.Background(), testEnv("s", 0), c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

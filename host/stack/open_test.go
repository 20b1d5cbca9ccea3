package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

// testYAML is a small stack with every built-in role: a host L1 pool, an
// shm-backed L2 slab, an in-memory store and an L3 disk store with its
// LMDB index, all under dir.
func testYAML(dir string) string {
	return fmt.Sprintf(`version: 1
model:
  page_tokens: 16
  payloads:
    - {name: kv, page_bytes: 16KiB}
tiers:
  - name: l1
    role: pool
    use: host
    config: {pages: 8, layers: 4, workers: 1}
  - name: l2
    role: slab
    use: l2hugetlb
    config: {size: 4MiB, fallback: shm, mount: %[1]s/no-hugetlbfs, shm_dir: %[1]s/shm, name: stacktest}
  - name: mem
    role: store
    use: memstore
    config: {capacity: 1MiB}
  - name: l3
    role: store
    use: l3disk
    index: {use: lmdb, config: {dir: %[1]s/index}}
    config:
      disks: [{dir: %[1]s/l3, budget: 8MiB}]
`, dir)
}

func load(t *testing.T, yaml string) (*config.Stack, Registries) {
	t.Helper()
	tr, err := builtin.Tiers()
	if err != nil {
		t.Fatal(err)
	}
	ix, err := builtin.Indexes()
	if err != nil {
		t.Fatal(err)
	}
	pr, err := builtin.Policies()
	if err != nil {
		t.Fatal(err)
	}
	st, err := config.Load([]byte(yaml), "test.yaml", config.Modules{Tiers: tr, Indexes: ix, Policies: pr})
	if err != nil {
		t.Fatal(err)
	}
	return st, Registries{Tiers: tr, Indexes: ix}
}

func TestOpenEveryRole(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "shm"), 0o755); err != nil {
		t.Fatal(err)
	}
	st, regs := load(t, testYAML(dir))
	var logs bytes.Buffer
	s, err := Open(context.Background(), st, regs, Options{
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), StackID: "stacktest", ColdStart: tiers.ColdStartClear,
	})
	if err != nil {
		t.Fatalf("open: %v\nlogs:\n%s", err, logs.String())
	}
	if s.Slab == nil || s.Pool == nil || s.PoolName != "l1" {
		t.Fatalf("slab %v pool %v (%q)", s.Slab, s.Pool, s.PoolName)
	}
	if len(s.Stores) != 2 || s.Stores[0].Name != "mem" || s.Stores[1].Name != "l3" || s.Stores[0].Index != nil || s.Stores[1].Index == nil {
		t.Fatalf("stores %+v", s.Stores)
	}
	// A page goes L1 -> L2 -> L3 and comes back: the stack is wired.
	size := st.Payload.Kinds[0].PageBytes
	src := tiers.Span{Slab: 0, Offset: 0, Length: size}
	dst := tiers.Span{Slab: 0, Offset: size, Length: size}
	b, err := s.Slab.Bytes(src)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	want := bytes.Clone(b)
	ctx := context.Background()
	waitPool(t, s.Pool, mustID(s.Pool.CopyFromSlab(ctx, []tiers.PoolCopy{{Page: 2, Kind: 0, Span: src}})))
	clear(b)
	waitPool(t, s.Pool, mustID(s.Pool.CopyToSlab(ctx, []tiers.PoolCopy{{Page: 2, Kind: 0, Span: src}})))
	key := tiers.Key{Hash: pagehash.Hash{1, 2, 3}, Kind: 0}
	l3 := s.Stores[1].Store
	id, err := l3.Put(ctx, []tiers.PutRequest{{Key: key, Src: src}})
	if err != nil {
		t.Fatal(err)
	}
	waitDurable(t, l3, id)
	if err := l3.Get(ctx, []tiers.GetRequest{{Key: key, Dst: dst}}, make([]error, 1)); err != nil {
		t.Fatal(err)
	}
	got, _ := s.Slab.Bytes(dst)
	if !bytes.Equal(got, want) {
		t.Fatal("the page came back from L1 -> L2 -> L3 -> L2 with different bytes")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

// TestOpenFailureClosesWhatWasOpened breaks the last tier to open (the
// pool, over a payload it cannot split): the error names it, and the slab
// and stores opened before it are closed (the slab's files are gone).
func TestOpenFailureClosesWhatWasOpened(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "shm"), 0o755); err != nil {
		t.Fatal(err)
	}
	yaml := strings.Replace(testYAML(dir), "layers: 4", "layers: 3", 1)
	st, regs := load(t, yaml)
	_, err := Open(context.Background(), st, regs, Options{StackID: "stacktest", ColdStart: tiers.ColdStartClear})
	if err == nil || !strings.Contains(err.Error(), `pool tier "l1"`) || !errors.Is(err, tiers.ErrInvalid) {
		t.Fatalf("open with a broken pool: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "shm", "stacktest*"))
	if len(left) != 0 {
		t.Fatalf("slab files left after the failed open: %v", left)
	}
	// The L3 store and its index were closed: a second open of the same
	// directories succeeds (LMDB and the store's lock are free).
	st2, regs2 := load(t, testYAML(dir))
	s, err := Open(context.Background(), st2, regs2, Options{StackID: "stacktest", ColdStart: tiers.ColdStartClear})
	if err != nil {
		t.Fatalf("reopen after the failed open: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestOpenRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	st, regs := load(t, testYAML(dir))
	cases := []struct {
		name string
		st   *config.Stack
		regs Registries
		opts Options
		want string
	}{
		{"no config", nil, regs, Options{StackID: "x"}, "no config"},
		{"no registries", st, Registries{}, Options{StackID: "x"}, "registries are required"},
		{"no stack id", st, regs, Options{}, "no stack id"},
	}
	for _, c := range cases {
		if _, err := Open(context.Background(), c.st, c.regs, c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

func mustID(id tiers.BatchID, err error) tiers.BatchID {
	if err != nil {
		panic(err)
	}
	return id
}

func waitPool(t *testing.T, p tiers.Pool, id tiers.BatchID) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		for _, a := range p.DrainAcks(nil) {
			if a.Batch == id {
				if a.Stage != tiers.AckCopied {
					t.Fatalf("pool ack %+v", a)
				}
				return
			}
		}
		select {
		case <-p.AckReady():
		case <-deadline:
			t.Fatalf("pool batch %d not acked", id)
		}
	}
}

func waitDurable(t *testing.T, s tiers.Store, id tiers.BatchID) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		for _, a := range s.DrainAcks(nil) {
			if a.Batch != id {
				continue
			}
			switch a.Stage {
			case tiers.AckDurable:
				return
			case tiers.AckFailed:
				t.Fatalf("put failed: %v", a.Err)
			}
		}
		select {
		case <-s.AckReady():
		case <-deadline:
			t.Fatalf("put batch %d not durable", id)
		}
	}
}

// TestSharedIndex: two stacks opened with one Shared whose configs name
// the same LMDB index get the same index (without Shared the second open
// is refused: an LMDB environment opens once per process); the index stays
// open until the last stack closes. A stack naming another index gets its
// own.
func TestSharedIndex(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "shm"), 0o755); err != nil {
		t.Fatal(err)
	}
	yaml := func(slab, index string) string {
		y := strings.Replace(testYAML(dir), "name: stacktest", "name: "+slab, 1)
		return strings.Replace(y, dir+"/index", dir+"/"+index, 1)
	}
	open := func(id, slab, index string, sh *Shared) (*Stack, error) {
		st, regs := load(t, yaml(slab, index))
		return Open(context.Background(), st, regs, Options{Logger: slog.New(slog.DiscardHandler), StackID: id, ColdStart: tiers.ColdStartClear, Shared: sh})
	}
	a, err := open("a", "sa", "index", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open("b", "sb", "index", nil); err == nil || !strings.Contains(err.Error(), "already open in this process") {
		t.Fatalf("a second open of one LMDB index without Shared: %v, want refused", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	sh := NewShared()
	a, err = open("a", "sa", "index", sh)
	if err != nil {
		t.Fatal(err)
	}
	b, err := open("b", "sb", "index", sh)
	if err != nil {
		t.Fatal(err)
	}
	c, err := open("c", "sc", "other-index", sh)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if a.Stores[1].Index != b.Stores[1].Index || a.Stores[1].Index == c.Stores[1].Index {
		t.Fatalf("indexes a %p b %p c %p: want a and b one, c its own", a.Stores[1].Index, b.Stores[1].Index, c.Stores[1].Index)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	ix := b.Stores[1].Index
	if _, err := ix.Stats(context.Background()); err != nil {
		t.Fatalf("the shared index after the first stack closed: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := ix.Stats(context.Background()); !errors.Is(err, indexes.ErrClosed) {
		t.Fatalf("the shared index after the last stack closed: %v, want closed", err)
	}
}

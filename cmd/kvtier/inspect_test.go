package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/badger"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/registry"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l3disk"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// writeL3 stores n pages through a real l3disk store over a badger index
// in base/disk and base/index, adds one dangling index entry, and closes
// both.
func writeL3(t *testing.T, base string, n int) {
	t.Helper()
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	bc := badger.DefaultConfig()
	bc.Dir = filepath.Join(base, "index")
	bc.MemTableBytes = 16 << 20
	ix, err := badger.Open(ctx, indexes.Env{Logger: log}, bc)
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	cfg := l3disk.DefaultConfig()
	cfg.Disks = []l3disk.Disk{{Dir: filepath.Join(base, "disk")}}
	cfg.Slots, cfg.PLPProbes = 16, 0
	geom := tiers.PayloadGeometry{PageTokens: 1, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: 10000}}}
	slab := tiertest.NewHeapSlab(int64(n) * 10000)
	st, err := l3disk.Open(ctx, tiers.Env{Logger: log, Payload: geom, WorldSize: 1, StackID: "t", Slab: slab, Index: ix}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	reqs := make([]tiers.PutRequest, n)
	for i := range reqs {
		reqs[i] = tiers.PutRequest{Key: tiers.Key{Hash: pagehash.Hash{byte(i + 1)}}, Src: tiers.Span{Offset: int64(i) * 10000, Length: 10000}}
	}
	if _, err := st.Put(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for durable := 0; durable < n; {
		for _, a := range st.DrainAcks(nil) {
			if a.Stage == tiers.AckDurable {
				durable++
			} else if a.Stage == tiers.AckFailed {
				t.Fatal(a.Err)
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("puts did not finish")
		}
		time.Sleep(time.Millisecond)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	// A dangling entry: names slot 15, never written.
	recs, found := make([]indexes.Record, 1), make([]bool, 1)
	if err := ix.Get(ctx, []indexes.Key{{Hash: pagehash.Hash{1}}}, recs, found); err != nil || !found[0] {
		t.Fatalf("record of page 1: %v", err)
	}
	rec := recs[0]
	rec.Slot = 15
	if err := ix.Put(ctx, []indexes.Entry{{Key: indexes.Key{Hash: pagehash.Hash{0xdd}}, Record: rec}}); err != nil {
		t.Fatal(err)
	}
}

func TestInspectL3(t *testing.T) {
	base := t.TempDir()
	writeL3(t, base, 5)
	disk, ixDir := filepath.Join(base, "disk"), filepath.Join(base, "index")
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"inspect", "l3", "--dir", disk, "--index", "badger", "--index-dir", ixDir}, &out, &errOut)
	if !errors.Is(err, errDamage) {
		t.Fatalf("inspect: %v, want damage\n%s%s", err, out.String(), errOut.String())
	}
	for _, want := range []string{"slots: 5 live, 0 orphan, 0 corrupt, 0 lost, 11 free", "1 without a valid slot", "status: DAMAGED"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	err = run(context.Background(), []string{"inspect", "l3", "--dir", disk, "--index-dir", ixDir, "--repair"}, &out, &errOut)
	if !errors.Is(err, errDamage) || !strings.Contains(out.String(), "repaired: 1 index entries deleted") {
		t.Fatalf("repair: %v\n%s", err, out.String())
	}
	// With a stack config naming the same disk and index.
	cfg := filepath.Join(base, "stack.yaml")
	yaml := `version: 1
model:
  page_tokens: 1
  payloads: [{name: kv, page_bytes: 10000}]
tiers:
  - name: l2
    role: slab
    use: testslab
  - name: l3
    role: store
    use: l3disk
    index: {use: badger, config: {dir: ` + ixDir + `}}
    config:
      disks: [{dir: ` + disk + `, budget: 1MiB}]
`
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := inspectL3(context.Background(), []string{"--config", cfg}, &out, &errOut, modulesWithSlab(t)); err != nil {
		t.Fatalf("inspect --config after repair: %v\n%s%s", err, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "status: ok") || !strings.Contains(out.String(), "5 live") {
		t.Fatalf("output:\n%s", out.String())
	}
	// The same stack written for serve: its placeholders stand for
	// --data-dir (and the rank).
	serveCfg := filepath.Join(base, "serve.yaml")
	serveYAML := strings.NewReplacer(ixDir, "{{DIR}}/index", disk, "{{DIR}}/disk").Replace(yaml)
	if err := os.WriteFile(serveCfg, []byte(serveYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := inspectL3(context.Background(), []string{"--config", serveCfg, "--data-dir", base}, &out, &errOut, modulesWithSlab(t)); err != nil {
		t.Fatalf("inspect --config of serve's shape: %v\n%s%s", err, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "status: ok") || !strings.Contains(out.String(), "5 live") {
		t.Fatalf("output, serve's shape:\n%s", out.String())
	}
	if err := inspectL3(context.Background(), []string{"--config", serveCfg, "--data-dir", base, "--rank", "1"}, &out, &errOut, modulesWithSlab(t)); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "ranks 0..0") {
		t.Errorf("--rank 1 of a one-rank serve stack: %v, want a usage error naming its ranks", err)
	}
	for _, bad := range [][]string{
		{"inspect", "l3"},
		{"inspect", "l3", "--config", cfg, "--dir", disk},
		{"inspect", "l4"},
	} {
		if err := run(context.Background(), bad, &out, &errOut); !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}
}

// modulesWithSlab is the built-in registries plus a slab module that only
// exists so a stack config with an l3disk tier validates (inspect never
// opens the slab).
func modulesWithSlab(t *testing.T) config.Modules {
	t.Helper()
	var m config.Modules
	var err error
	if m.Tiers, err = builtin.Tiers(); err != nil {
		t.Fatal(err)
	}
	if m.Indexes, err = builtin.Indexes(); err != nil {
		t.Fatal(err)
	}
	if m.Policies, err = builtin.Policies(); err != nil {
		t.Fatal(err)
	}
	err = m.Tiers.Slabs.Register(registry.Registration[tiers.Factory[tiers.Slab]]{
		Type: tiers.SlabV1, Name: "testslab",
		Factory: func(context.Context, tiers.Env, any) (tiers.Slab, error) {
			return nil, errors.New("testslab is never opened")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// writeEmptyBadger creates an empty badger index in dir.
func writeEmptyBadger(t *testing.T, dir string) {
	t.Helper()
	bc := badger.DefaultConfig()
	bc.Dir = dir
	bc.MemTableBytes = 16 << 20
	ix, err := badger.Open(context.Background(), indexes.Env{Logger: slog.New(slog.DiscardHandler)}, bc)
	if err != nil {
		t.Fatal(err)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
}

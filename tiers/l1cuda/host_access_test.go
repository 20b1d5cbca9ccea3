package l1cuda

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// TestHostPageAccess: WritePage scatters a page into its layer slices the
// way CopyFromSlab does and ReadPage gathers it the way CopyToSlab does;
// bad pages, kinds and buffer sizes are ErrInvalid, a closed pool ErrClosed.
func TestHostPageAccess(t *testing.T) {
	const size = 4 * 1024
	payload := tiers.PayloadGeometry{PageTokens: 16, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: size}}}
	slab := tiertest.NewHeapSlab(4 * size)
	p, err := OpenHost(tiers.Env{Logger: slog.New(slog.DiscardHandler), Payload: payload, WorldSize: 1, Slab: slab}, HostConfig{Pages: 4, Layers: 4, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	page := make([]byte, size)
	for i := range page {
		page[i] = byte(i*13 + 1)
	}
	if err := p.WritePage(2, 0, page); err != nil {
		t.Fatal(err)
	}
	span := tiers.Span{Offset: size, Length: size}
	id, err := p.CopyToSlab(context.Background(), []tiers.PoolCopy{{Page: 2, Span: span}})
	if err != nil {
		t.Fatal(err)
	}
	for acked := false; !acked; {
		for _, a := range p.DrainAcks(nil) {
			acked = acked || a.Batch == id
		}
		if !acked {
			<-p.AckReady()
		}
	}
	got, _ := slab.Bytes(span)
	if !bytes.Equal(got, page) {
		t.Fatal("CopyToSlab of a written page differs")
	}
	back := make([]byte, size)
	if err := p.ReadPage(2, 0, back); err != nil || !bytes.Equal(back, page) {
		t.Fatalf("ReadPage: %v, equal %v", err, bytes.Equal(back, page))
	}
	for _, c := range []struct {
		page, kind, n int
	}{{-1, 0, size}, {4, 0, size}, {0, 1, size}, {0, 0, size - 1}} {
		if err := p.ReadPage(c.page, tiers.PayloadKind(c.kind), make([]byte, c.n)); !errors.Is(err, tiers.ErrInvalid) {
			t.Errorf("read %+v: %v", c, err)
		}
		if err := p.WritePage(c.page, tiers.PayloadKind(c.kind), make([]byte, c.n)); !errors.Is(err, tiers.ErrInvalid) {
			t.Errorf("write %+v: %v", c, err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.ReadPage(0, 0, back); !errors.Is(err, tiers.ErrClosed) {
		t.Errorf("read after close: %v", err)
	}
}

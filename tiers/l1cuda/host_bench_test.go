package l1cuda

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/kvtier/kvtier/internal/memcopy"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// BenchmarkHostPool moves 32 pages of 2.75 MiB (64 layer slices each)
// between the host pool and slab spans, both ways, and the same bytes
// with one memcopy.Copy of a contiguous buffer, in the same run: the
// limit. It reports GB/s of each and the ratios.
func BenchmarkHostPool(b *testing.B) {
	const pages, layers = 32, 64
	payload := tiers.PayloadGeometry{PageTokens: 512, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: layers * 45056}}}
	size := payload.Kinds[0].PageBytes
	slab := tiertest.NewHeapSlab(2 * pages * size)
	p, err := OpenHost(tiers.Env{Logger: slog.New(slog.DiscardHandler), Payload: payload, WorldSize: 1, Slab: slab},
		HostConfig{Pages: pages, Layers: layers, Workers: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	batch := make([]tiers.PoolCopy, pages)
	for i := range batch {
		batch[i] = tiers.PoolCopy{Page: i, Kind: 0, Span: tiers.Span{Offset: int64(i) * size, Length: size}}
	}
	run := func(toSlab bool) time.Duration { return timeBatch(b, p, toSlab, batch) }
	src := make([]byte, pages*size)
	for i := range src {
		// NB: never-written memory reads the kernel's shared zero page,
		// which would make the memcpy limit look faster than it is.
		src[i] = byte(i*7 + 1)
	}
	dst, _ := slab.Bytes(tiers.Span{Offset: 0, Length: pages * size})
	var toSlab, fromSlab, limit time.Duration
	run(false) // fault every page of both sides in before timing
	run(true)
	memcopy.Copy(dst, src)
	b.ResetTimer()
	for range b.N {
		toSlab += run(true)
		fromSlab += run(false)
		s := time.Now()
		memcopy.Copy(dst, src)
		limit += time.Since(s)
	}
	gbps := func(d time.Duration) float64 { return float64(b.N) * float64(pages*size) / d.Seconds() / 1e9 }
	b.ReportMetric(gbps(toSlab), "to-slab-GB/s")
	b.ReportMetric(gbps(fromSlab), "from-slab-GB/s")
	b.ReportMetric(gbps(limit), "memcpy-GB/s")
	b.ReportMetric(gbps(toSlab)/gbps(limit), "to-slab-ratio")
	b.ReportMetric(gbps(fromSlab)/gbps(limit), "from-slab-ratio")
}

// timeBatch runs one copy batch on p and returns how long it took until
// every item was acked copied. It waits on AckReady: busy polling would
// steal a core from the copy it measures.
func timeBatch(b *testing.B, p tiers.Pool, toSlab bool, batch []tiers.PoolCopy) time.Duration {
	start := time.Now()
	var id tiers.BatchID
	var err error
	if toSlab {
		id, err = p.CopyToSlab(context.Background(), batch)
	} else {
		id, err = p.CopyFromSlab(context.Background(), batch)
	}
	if err != nil {
		b.Fatal(err)
	}
	for n := 0; n < len(batch); {
		for _, a := range p.DrainAcks(nil) {
			if a.Batch != id || a.Stage != tiers.AckCopied {
				b.Fatalf("ack %+v", a)
			}
			n++
		}
		if n < len(batch) {
			<-p.AckReady()
		}
	}
	return time.Since(start)
}

package l3disk

import (
	"context"
	"testing"

	"github.com/kvtier/kvtier/internal/crc32c"
	"github.com/kvtier/kvtier/tiers"
)

// TestProducerSumAcrossRestart: the producer's sum is what the slot
// header keeps, so it holds across a cold start "load" too: pages put with
// a correct sum come back exact, pages whose source changed after their
// sum was taken are misses before and after the restart (the
// conformance suite's ProducerSums checks the same in one run).
func TestProducerSumAcrossRestart(t *testing.T) {
	cases := []struct {
		name    string
		hasSum  bool
		changed bool
		wantHit bool
	}{
		{name: "own sum", wantHit: true},
		{name: "producer sum", hasSum: true, wantHit: true},
		{name: "source changed after the producer sum", hasSum: true, changed: true},
	}
	for _, ix := range testIndexes() {
		t.Run(ix.name, func(t *testing.T) {
			r := newRig(t, ix, 64)
			r.open(tiers.ColdStartClear)
			groups := make([][]testPage, len(cases))
			for ci, c := range cases {
				pages := makePages(uint64(40+ci), 6, tiers.PayloadKind(ci%2), r.geom)
				groups[ci] = pages
				reqs := make([]tiers.PutRequest, len(pages))
				for i, p := range pages {
					sp := r.span(i, p.key.Kind)
					b, err := r.slab.Bytes(sp)
					if err != nil {
						t.Fatal(err)
					}
					copy(b, p.data)
					reqs[i] = tiers.PutRequest{Key: p.key, Src: sp, Sum: crc32c.Checksum(p.data), HasSum: c.hasSum}
					if c.changed {
						b[len(b)-1-i] ^= 1
					}
				}
				id, err := r.store.Put(context.Background(), reqs)
				if err != nil {
					t.Fatalf("%s: put: %v", c.name, err)
				}
				for i, err := range r.waitBatch(id, len(pages)) {
					if err != nil {
						t.Fatalf("%s: put item %d: %v", c.name, i, err)
					}
				}
			}
			check := func(when string) {
				for ci, c := range cases {
					// r.get fails on a hit with any bytes but the original page's.
					want := 0
					if c.wantHit {
						want = len(groups[ci])
					}
					if h := countHits(r.get(groups[ci], 100)); h != want {
						t.Fatalf("%s, %s: %d of %d hit, want %d", when, c.name, h, len(groups[ci]), want)
					}
				}
			}
			check("before restart")
			r.checkConsistent()
			r.close()
			r.open(tiers.ColdStartLoad)
			check("after restart")
			r.checkConsistent()
		})
	}
}

package pagestore

import (
	"context"
	"fmt"
	"testing"

	pb "github.com/kvtier/kvtier/api/storev1"
	"github.com/kvtier/kvtier/internal/slabfile"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/lru"
	"github.com/kvtier/kvtier/tiers"
)

// The seed's page geometry: 2.75 MiB a page (k and v of 1.375 MiB),
// batches of 128 (SGLang's STORAGE_BATCH_SIZE).
var seedKinds = []tiers.PayloadSpec{{Name: "k", PageBytes: 1441792}, {Name: "v", PageBytes: 1441792}}

const seedBatch = 128

// seedDoor opens a door (no store below: the door's own cost) over a
// slab of one batch of seed pages.
func seedDoor(b *testing.B, skipVerify bool) (*Door, tiers.Slab, string) {
	b.Helper()
	slab, err := slabfile.Open(context.Background(), nil, "/dev/shm", fmt.Sprintf("pagestore-bench-%v", skipVerify), seedBatch*2*1441792+(4<<20), false)
	if err != nil {
		b.Fatal(err)
	}
	d, err := Open(Options{Slab: slab, Payload: tiers.PayloadGeometry{PageTokens: 64, Kinds: seedKinds}, BootID: "bench",
		NewEvictor: func() (policy.Evictor, error) { return lru.New(policy.Options{}) }, SkipVerify: skipVerify})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = d.Stop(); _ = slab.Close() })
	ns := &pb.Namespace{Model: "m", PageTokens: 64, Kinds: []*pb.PayloadKind{{Name: "k", PageBytes: 1441792}, {Name: "v", PageBytes: 1441792}}}
	r, err := d.Register(context.Background(), &pb.RegisterRequest{Namespace: ns, ProtocolVersions: []uint32{1}})
	if err != nil {
		b.Fatal(err)
	}
	return d, slab, r.GetSession()
}

func seedKeys() []string {
	keys := make([]string, seedBatch)
	for i := range keys {
		keys[i] = fmt.Sprintf("%064x", i)
	}
	return keys
}

func spanBytes(b *testing.B, slab tiers.Slab, s *pb.Span) []byte {
	v, err := slab.Bytes(tiers.Span{Slab: tiers.SlabID(s.GetSlab()), Offset: int64(s.GetOffset()), Length: int64(s.GetLength())})
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// BenchmarkStoreGetL2 is a client's get of one batch of slab hits:
// BatchGet, the copy slab -> host pool, Release; against memcpy, the same
// copy alone. Run:
//
//	go test -run '^$' -bench BenchmarkStoreGetL2 -benchtime 20x ./host/pagestore/
func BenchmarkStoreGetL2(b *testing.B) {
	pool := make([]byte, seedBatch*2*1441792)
	for _, mode := range []string{"memcpy", "get-verify", "get-noverify"} {
		b.Run(mode, func(b *testing.B) {
			d, slab, ses := seedDoor(b, mode == "get-noverify")
			keys := seedKeys()
			ctx := context.Background()
			r, err := d.BatchSet(ctx, &pb.SetRequest{Session: ses, Keys: keys})
			if err != nil {
				b.Fatal(err)
			}
			var spans [][]byte
			w := make([]bool, len(keys))
			for i, p := range r.GetPages() {
				for _, s := range p.GetSpans() {
					v := spanBytes(b, slab, s)
					copy(v, pool[len(spans)*len(v):])
					spans = append(spans, v)
				}
				w[i] = true
			}
			if _, err := d.Commit(ctx, &pb.CommitRequest{Session: ses, Lease: r.GetLease(), Written: w}); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(pool)))
			b.ResetTimer()
			for range b.N {
				if mode == "memcpy" {
					at := 0
					for _, v := range spans {
						at += copy(pool[at:], v)
					}
					continue
				}
				g, err := d.BatchGet(ctx, &pb.GetRequest{Session: ses, Keys: keys})
				if err != nil {
					b.Fatal(err)
				}
				at := 0
				for _, p := range g.GetPages() {
					if p.GetStatus() != pb.GetStatus_GET_STATUS_HIT {
						b.Fatalf("get: %v", p.GetStatus())
					}
					for _, s := range p.GetSpans() {
						at += copy(pool[at:], spanBytes(b, slab, s))
					}
				}
				if _, err := d.Release(ctx, &pb.ReleaseRequest{Session: ses, Lease: g.GetLease()}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkStoreSet is a client's set of one batch of new pages: BatchSet,
// the copy host pool -> slab, Commit (the CRC32C pass); against memcpy.
// The slab holds one batch, so each set evicts the previous one. Run:
//
//	go test -run '^$' -bench BenchmarkStoreSet -benchtime 20x ./host/pagestore/
func BenchmarkStoreSet(b *testing.B) {
	pool := make([]byte, seedBatch*2*1441792)
	for i := range pool {
		pool[i] = byte(i * 7)
	}
	for _, mode := range []string{"memcpy", "set"} {
		b.Run(mode, func(b *testing.B) {
			d, slab, ses := seedDoor(b, false)
			ctx := context.Background()
			b.SetBytes(int64(len(pool)))
			// The memcpy's destination: the slab's first batch of spans.
			var dst [][]byte
			if mode == "memcpy" {
				r, err := d.BatchSet(ctx, &pb.SetRequest{Session: ses, Keys: seedKeys()})
				if err != nil {
					b.Fatal(err)
				}
				for _, p := range r.GetPages() {
					for _, s := range p.GetSpans() {
						dst = append(dst, spanBytes(b, slab, s))
					}
				}
			}
			b.ResetTimer()
			for n := range b.N {
				if mode == "memcpy" {
					at := 0
					for _, v := range dst {
						at += copy(v, pool[at:])
					}
					continue
				}
				keys := make([]string, seedBatch)
				for i := range keys {
					keys[i] = fmt.Sprintf("%d-%064x", n, i)
				}
				r, err := d.BatchSet(ctx, &pb.SetRequest{Session: ses, Keys: keys})
				if err != nil {
					b.Fatal(err)
				}
				at := 0
				w := make([]bool, len(keys))
				for i, p := range r.GetPages() {
					if p.GetStatus() != pb.SetStatus_SET_STATUS_RESERVED {
						b.Fatalf("set: %v", p.GetStatus())
					}
					for _, s := range p.GetSpans() {
						at += copy(spanBytes(b, slab, s), pool[at:])
					}
					w[i] = true
				}
				if _, err := d.Commit(ctx, &pb.CommitRequest{Session: ses, Lease: r.GetLease(), Written: w}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkStoreExistsDoor is BatchExists of one batch of slab pages in
// process (no gRPC): the door's own share of the call. Run:
//
//	go test -run '^$' -bench BenchmarkStoreExistsDoor ./host/pagestore/
func BenchmarkStoreExistsDoor(b *testing.B) {
	h := newHarness(b, 256, true, nil, Limits{})
	ses := h.register(b)
	keys := seedKeys()
	for i := 0; i < len(keys); i += 32 {
		h.set(b, ses, keys[i:i+32]...)
	}
	q := &pb.ExistsRequest{Session: ses, Keys: keys}
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		r, err := h.d.BatchExists(ctx, q)
		if err != nil || r.GetPresent() != seedBatch {
			b.Fatalf("%v %v", r.GetPresent(), err)
		}
	}
}

package serve

import (
	"context"
	"fmt"
	"testing"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/pagehash"
)

// BenchmarkStep: one engine rank, each step finishing 32 requests (their
// lookups DONE in the previous step) and looking up 32 new ones, keys of
// 16 pages sharing an 8-page prefix, plans run in process. step-ns/op is
// one Step round trip over the unix socket (ns/op adds the test engine's
// payloads and copies); compare with BenchmarkPing.
func BenchmarkStep(b *testing.B) {
	ctx := context.Background()
	_, sock, _ := startServer(b, b.TempDir(), 1)
	e := dialEngine(b, sock, 0, 1)
	if err := e.register(ctx); err != nil {
		b.Fatal(err)
	}
	const per = 32
	keys := map[string][]pagehash.Hash{}
	var prev []string
	done := map[string]bool{}
	n := 0
	b.ResetTimer()
	for range b.N {
		q := &pb.StepRequest{}
		for _, name := range prev {
			// A lookup still PENDING is finished without its store.
			if k := keys[name]; done[name] {
				q.Stores = append(q.Stores, &pb.Store{ReqId: name, Pages: uint32(len(k)), Hashes: packHashes(k)})
			}
			q.Finished = append(q.Finished, &pb.Finish{ReqId: name})
		}
		cur := make([]string, 0, per)
		for range per {
			name := fmt.Sprintf("q%d", n)
			keys[name] = chain(fmt.Sprintf("p%d", n%4), 8, 16, name)
			q.Lookups = append(q.Lookups, &pb.Lookup{ReqId: name, Pages: 16, Hashes: packHashes(keys[name])})
			cur = append(cur, name)
			n++
		}
		out, err := e.run(ctx, q, keys)
		if err != nil {
			b.Fatal(err)
		}
		if len(out.Errors) > 0 {
			b.Fatalf("step errors: %v", out.Errors[0])
		}
		for _, name := range prev {
			delete(keys, name)
			delete(done, name)
		}
		for _, l := range out.GetLookups() {
			if l.GetStatus() == pb.LookupStatus_LOOKUP_STATUS_DONE {
				done[l.GetReqId()] = true
			}
		}
		prev = cur
	}
	b.ReportMetric(float64(e.rpc.Nanoseconds())/float64(b.N), "step-ns/op")
}

// BenchmarkPing: the empty call on the same socket, the limit of Step.
func BenchmarkPing(b *testing.B) {
	ctx := context.Background()
	_, sock, _ := startServer(b, b.TempDir(), 1)
	e := dialEngine(b, sock, 0, 1)
	b.ResetTimer()
	for range b.N {
		if _, err := e.cl.Ping(ctx, &pb.PingRequest{}); err != nil {
			b.Fatal(err)
		}
	}
}

package serve

import (
	"context"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/kvtier/kvtier/api/enginev1"
)

// FuzzStep feeds arbitrary Step messages (decoded from the fuzzer's bytes)
// to a running serve, half of them under the live session: no input may
// crash it, every reply carries the boot id, and afterwards a well-formed
// request still runs and its hit bytes verify.
func FuzzStep(f *testing.F) {
	ctx := context.Background()
	s, sock, _ := startServer(f, f.TempDir(), 1)
	e := dialEngine(f, sock, 0, 1)
	if err := e.register(ctx); err != nil {
		f.Fatal(err)
	}
	key := chain("fuzz", 4, 4, "")
	drive(f, ctx, e, "seed", key)
	for _, q := range []*pb.StepRequest{
		{Lookups: []*pb.Lookup{{ReqId: "a", Pages: 4, Hashes: packHashes(key)}}},
		{Lookups: []*pb.Lookup{{ReqId: "a", Pages: 3, Hashes: packHashes(key)}}},
		{Stores: []*pb.Store{{ReqId: "a", Pages: 4, Hashes: packHashes(key)}}, Finished: []*pb.Finish{{ReqId: "a"}}},
		{Completions: []*pb.Completion{{Plan: 1, Ok: true}, {Plan: 1}}},
		{Aborted: []*pb.Abort{{ReqId: "a"}}, Frontier: []byte("x")},
	} {
		b, _ := proto.Marshal(q)
		f.Add(b, true)
		f.Add(b, false)
	}
	f.Fuzz(func(t *testing.T, b []byte, live bool) {
		q := &pb.StepRequest{}
		if proto.Unmarshal(b, q) != nil {
			return
		}
		if live {
			e.step++
			q.Session, q.BootId, q.Step = e.reg.Session, e.reg.BootId, e.step
		}
		out, err := s.Step(ctx, q)
		if err != nil {
			t.Fatalf("Step returned a call error for a decodable message: %v", err)
		}
		if out.BootId != s.BootID() {
			t.Fatalf("reply boot_id %q", out.BootId)
		}
		for _, ie := range out.Errors {
			if ie.Item == "" || ie.Message == "" {
				t.Fatalf("an item error that names nothing: %v", ie)
			}
		}
		// Plans the fuzzer's items made are failed, as an engine that
		// could not run them would.
		for _, pl := range out.Plans {
			e.done = append(e.done, &pb.Completion{Plan: pl.Plan})
		}
	})
}

// FuzzRegister: any Register message is answered or refused, never a
// crash.
func FuzzRegister(f *testing.F) {
	ctx := context.Background()
	s, _, _ := startServer(f, f.TempDir(), 1)
	good := &pb.RegisterRequest{EngineId: "f", WorldSize: 1, Namespace: &pb.Namespace{Model: "m", PageTokens: 512, PageBytes: []uint64{16 << 10}}}
	b, _ := proto.Marshal(good)
	f.Add(b)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		q := &pb.RegisterRequest{}
		if proto.Unmarshal(b, q) != nil {
			return
		}
		out, err := s.Register(ctx, q)
		if err == nil && (out.Session == "" || out.BootId != s.BootID()) {
			t.Fatalf("a registration without a session: %v", out)
		}
	})
}

// FuzzKeys: the hash decoder refuses any length that is not pages x 32.
func FuzzKeys(f *testing.F) {
	f.Add(uint32(1), make([]byte, 32))
	f.Add(uint32(2), make([]byte, 33))
	f.Add(uint32(1<<31), []byte{})
	f.Fuzz(func(t *testing.T, pages uint32, b []byte) {
		var k keyer
		hs, err := k.keys(nil, pages, b)
		if (err == nil) != (uint64(len(b)) == uint64(pages)*32) {
			t.Fatalf("pages %d, %d bytes: err %v", pages, len(b), err)
		}
		if err == nil && len(hs) != int(pages) {
			t.Fatalf("%d keys for %d pages", len(hs), pages)
		}
	})
}

package serve

import (
	"bytes"
	"context"
	"encoding/binary"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/host/consensus"
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
	good := &pb.RegisterRequest{EngineId: "f", WorldSize: 1, ProtocolVersions: []uint32{1}, Namespace: &pb.Namespace{Model: "m", PageTokens: 512, PageBytes: []uint64{16 << 10}}}
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
		for j := range k {
			k[j] = byte(j*37 + 11)
		}
		hs, err := k.keys(nil, pages, b)
		if (err == nil) != (uint64(len(b)) == uint64(pages)*32) {
			t.Fatalf("pages %d, %d bytes: err %v", pages, len(b), err)
		}
		if err == nil && len(hs) != int(pages) {
			t.Fatalf("%d keys for %d pages", len(hs), pages)
		}
		// Each key is its hash XOR the namespace id, byte for byte.
		for i, h := range hs {
			for j := range h {
				if h[j] != b[i*32+j]^k[j] {
					t.Fatalf("key %d byte %d: %#x, want %#x ^ %#x", i, j, h[j], b[i*32+j], k[j])
				}
			}
		}
	})
}

// FuzzEngineFrontier: with the engine as the group transport, a Step's
// frontier is whatever bytes the engine sends. Any of them is refused with
// an item error naming the frontier (and the session ends) unless it is
// the reduction of the rank's contribution; never a crash, never a step
// applied over a wrong frontier. After each input a well-formed step with
// the right frontier runs.
func FuzzEngineFrontier(f *testing.F) {
	ctx := context.Background()
	s, sock, _ := startWith(f, Config{DataDir: f.TempDir(), Ranks: 1, Group: GroupEngine, SessionTTL: time.Minute})
	e := dialEngine(f, sock, 0, 1)
	e.engineGroup = true
	// ready registers when needed and steps once, so a frontier is owed;
	// it returns the contribution awaiting it.
	var owed []byte
	ready := func(t testing.TB) {
		t.Helper()
		if owed != nil {
			return
		}
		if err := e.register(ctx); err != nil {
			t.Fatal(err)
		}
		out, err := e.run(ctx, &pb.StepRequest{}, nil)
		if err != nil || len(out.Errors) > 0 || len(out.Contribution) == 0 {
			t.Fatalf("first step: %v %v", err, out.GetErrors())
		}
		owed = out.Contribution
	}
	ready(f)
	good, err := consensus.ReduceEncoded([][]byte{owed})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(owed)
	f.Add([]byte{})
	f.Add(good[:len(good)-1])
	f.Fuzz(func(t *testing.T, frontier []byte) {
		ready(t)
		want, err := consensus.ReduceEncoded([][]byte{owed})
		if err != nil {
			t.Fatal(err)
		}
		e.step++
		out, err := s.Step(ctx, &pb.StepRequest{Session: e.reg.Session, BootId: e.reg.BootId, Step: e.step, Frontier: frontier})
		if err != nil {
			t.Fatalf("Step returned a call error: %v", err)
		}
		for _, ie := range out.Errors {
			if ie.Item == "" || ie.Message == "" {
				t.Fatalf("an item error that names nothing: %v", ie)
			}
		}
		switch {
		case bytes.Equal(frontier, want):
			if len(out.Errors) > 0 || len(out.Contribution) == 0 {
				t.Fatalf("the right frontier was refused: %v", out.Errors)
			}
			owed = out.Contribution
		case len(frontier) == 0:
			if len(out.Errors) != 1 || out.Errors[0].Code != pb.ErrorCode_ERROR_CODE_STATE || !bytes.Equal(out.Contribution, owed) {
				t.Fatalf("a step without its frontier: %v", out.Errors)
			}
		case len(out.Errors) == 0:
			// Accepted: then it is a frontier of this group and tick with
			// nothing above the contribution (a MIN with ranks that did
			// less is a valid frontier; it commits less).
			_, fr, err := consensus.DecodeFrontier(frontier, consensus.Expect{
				Group: binary.LittleEndian.Uint64(want[8:]), Stack: binary.LittleEndian.Uint64(want[16:]), Size: 1})
			if err != nil {
				t.Fatalf("frontier %x accepted, but it does not decode: %v", frontier, err)
			}
			_, c, err := consensus.DecodeContribution(owed, consensus.Expect{
				Group: binary.LittleEndian.Uint64(want[8:]), Stack: binary.LittleEndian.Uint64(want[16:]), Size: 1})
			if err != nil {
				t.Fatal(err)
			}
			if err := consensus.CheckFrontier(0, c, fr); err != nil {
				t.Fatalf("frontier %x accepted against contribution %x: %v", frontier, owed, err)
			}
			owed = out.Contribution
		default:
			if out.Errors[0].Item != "frontier" {
				t.Fatalf("frontier %x refused naming %q", frontier, out.Errors[0].Item)
			}
			owed = nil // the session ended
		}
	})
}

// FuzzParseDoors: a list parses to distinct known doors, at least one,
// whose join parses back to the same; anything else is an error naming
// the door or the list.
func FuzzParseDoors(f *testing.F) {
	for _, s := range []string{"engine", "store", "engine,store", "store, engine", "engine,engine", "", ",", "engine,x", " "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ds, err := ParseDoors(s)
		if err != nil {
			if !strings.Contains(err.Error(), "door") {
				t.Fatalf("ParseDoors(%q): %v", s, err)
			}
			return
		}
		if len(ds) == 0 || len(ds) > 2 || (len(ds) == 2 && ds[0] == ds[1]) {
			t.Fatalf("ParseDoors(%q) = %q", s, ds)
		}
		back, err := ParseDoors(strings.Join(ds, ","))
		if err != nil || !slices.Equal(back, ds) {
			t.Fatalf("ParseDoors(%q) = %q does not round-trip: %q, %v", s, ds, back, err)
		}
	})
}

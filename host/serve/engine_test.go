package serve

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/host"
	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/internal/crc32c"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

// testEngine is a minimal engine rank for serve's own tests: an L1 of
// host memory, the slab mapped from the files Register names, plans run
// as the contract says, every read page verified against host.Payload.
// (The full synthetic engine is kvtier loadgen; this one has no policy.)
type testEngine struct {
	t     testing.TB
	conn  *grpc.ClientConn
	cl    pb.EngineClient
	rank  uint32
	world uint32
	ns    *pb.Namespace
	reg   *pb.RegisterReply
	step  uint64
	l1    [][]byte // per kind: l1_pages x page bytes
	slabs [][]byte
	done  []*pb.Completion
	// keys of the L1 pages as the engine wrote or loaded them.
	verified, wrong int
	// engineGroup: the engine is the group transport; frontier is what
	// the engine all-reduced from its ranks' last contributions (stepAll
	// reduces them), sent in the next step.
	engineGroup bool
	frontier    []byte
	// sums: report each TO_SLAB plan's CRC-32C per item (Completion.sums)
	// of the bytes written. scribble, when set, runs on each TO_SLAB
	// item's slab span after the copy and its sum (a writer that changes
	// the slab after the engine).
	sums     bool
	scribble func(sp []byte)
	// rpc is the time spent in Step calls (BenchmarkStep's round trip
	// without the test engine's own copies and payloads).
	rpc time.Duration
}

func dialEngine(t testing.TB, socket string, rank, world uint32) *testEngine {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	e := &testEngine{t: t, conn: conn, cl: pb.NewEngineClient(conn), rank: rank, world: world,
		ns: &pb.Namespace{Model: "test-model", KvLayout: "layer_first", Dtype: "bf16", PageTokens: 512, PageBytes: []uint64{16 << 10}, Shard: rank}}
	t.Cleanup(func() { e.close() })
	return e
}

func (e *testEngine) register(ctx context.Context) error {
	e.unmap()
	reg, err := e.cl.Register(ctx, &pb.RegisterRequest{EngineId: "test", Rank: e.rank, WorldSize: e.world, Namespace: e.ns, ProtocolVersions: []uint32{1}})
	if err != nil {
		return err
	}
	e.reg, e.step, e.done, e.frontier = reg, 0, nil, nil
	e.l1 = nil
	for _, k := range reg.Kinds {
		e.l1 = append(e.l1, make([]byte, int(reg.Limits.L1Pages)*int(k.PageBytes)))
	}
	for _, f := range reg.Slab.Files {
		fd, err := os.OpenFile(f.Path, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		b, err := unix.Mmap(int(fd.Fd()), 0, int(f.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		fd.Close()
		if err != nil {
			return fmt.Errorf("map %s: %w", f.Path, err)
		}
		e.slabs = append(e.slabs, b)
	}
	return nil
}

func (e *testEngine) unmap() {
	for _, b := range e.slabs {
		_ = unix.Munmap(b)
	}
	e.slabs = nil
}

func (e *testEngine) close() {
	e.unmap()
	e.conn.Close()
}

func (e *testEngine) page(kind, page uint32) []byte {
	n := e.reg.Kinds[kind].PageBytes
	return e.l1[kind][uint64(page)*n : uint64(page+1)*n]
}

// run sends one step with the completions owed and runs the reply.
func (e *testEngine) run(ctx context.Context, q *pb.StepRequest, keys map[string][]pagehash.Hash) (*pb.StepReply, error) {
	e.step++
	q.Session, q.BootId, q.Step = e.reg.Session, e.reg.BootId, e.step
	q.Completions = append(q.Completions, e.done...)
	e.done = nil
	if e.engineGroup && q.Frontier == nil {
		q.Frontier = e.frontier
	}
	t0 := time.Now()
	out, err := e.cl.Step(ctx, q)
	e.rpc += time.Since(t0)
	if err != nil {
		return nil, err
	}
	// A reply carries at most one result per req_id (docs/engine-api.md).
	seen := map[string]bool{}
	for _, l := range out.Lookups {
		if seen[l.ReqId] {
			e.t.Errorf("rank %d step %d: two results for %q in one reply: %v", e.rank, q.Step, l.ReqId, out.Lookups)
		}
		seen[l.ReqId] = true
	}
	for _, p := range out.Placements {
		hs := keys[p.ReqId]
		i := p.FirstPage
		for _, rg := range p.L1Pages {
			for pg := rg.Start; pg < rg.Start+rg.Count; pg++ {
				for k := range e.reg.Kinds {
					b := e.page(uint32(k), pg)
					host.Payload(b, hs[i], tiers.PayloadKind(k))
					if !e.owns(int(i)) {
						// Another rank's page: this rank never computes it.
						for j := range b {
							b[j] = ^b[j]
						}
					}
				}
				i++
			}
		}
	}
	for _, pl := range out.Plans {
		ok := true
		var sums []uint32
		for _, it := range pl.Items {
			if int(it.Slab) >= len(e.slabs) || it.Offset+it.Length > uint64(len(e.slabs[it.Slab])) || it.L1Page >= e.reg.Limits.L1Pages {
				ok = false
				continue
			}
			sp := e.slabs[it.Slab][it.Offset : it.Offset+it.Length]
			if pl.Direction == pb.Direction_DIRECTION_TO_SLAB {
				copy(sp, e.page(it.Kind, it.L1Page))
				if e.sums {
					sums = append(sums, crc32c.Checksum(sp))
				}
				if e.scribble != nil {
					e.scribble(sp)
				}
			} else {
				copy(e.page(it.Kind, it.L1Page), sp)
			}
		}
		c := &pb.Completion{Plan: pl.Plan, Ok: ok}
		if e.sums && ok && pl.Direction == pb.Direction_DIRECTION_TO_SLAB {
			c.Sums = sums
		}
		e.done = append(e.done, c)
	}
	return out, nil
}

// owns reports whether the page at position i of a key is this rank's
// (always, without owner lanes).
func (e *testEngine) owns(i int) bool {
	return control.OwnerOf(i, int(e.reg.OwnerLanes)) == control.OwnerOf(int(e.rank), int(e.reg.OwnerLanes))
}

// verify checks a DONE lookup's hit pages byte for byte (this rank's own,
// with owner lanes).
func (e *testEngine) verify(r *pb.LookupResult, key []pagehash.Hash) {
	want := make([]byte, e.reg.Kinds[0].PageBytes)
	i := 0
	for _, rg := range r.L1Pages {
		for pg := rg.Start; pg < rg.Start+rg.Count; pg++ {
			for k := range e.reg.Kinds {
				if !e.owns(i) {
					continue
				}
				host.Payload(want[:e.reg.Kinds[k].PageBytes], key[i], tiers.PayloadKind(k))
				if bytes.Equal(e.page(uint32(k), pg), want[:e.reg.Kinds[k].PageBytes]) {
					e.verified++
				} else {
					e.wrong++
				}
			}
			i++
		}
	}
}

func packHashes(hs []pagehash.Hash) []byte {
	b := make([]byte, 0, len(hs)*pagehash.Size)
	for _, h := range hs {
		b = append(b, h[:]...)
	}
	return b
}

// chain returns a key of n pages whose first shared pages equal prefix's.
func chain(prefix string, shared, n int, tail string) []pagehash.Hash {
	var hs []pagehash.Hash
	prev := pagehash.Root
	for i := range n {
		seed := prefix
		if i >= shared {
			seed = tail
		}
		toks := []uint32{uint32(i)}
		for _, c := range []byte(seed) {
			toks = append(toks, uint32(c))
		}
		prev = pagehash.Next(prev, toks)
		hs = append(hs, prev)
	}
	return hs
}

func reqName(i int) string { return "r" + strconv.Itoa(i) }

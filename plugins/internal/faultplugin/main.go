// Command faultplugin is a FAULT-INJECTING test plugin, never shipped: the
// example memstore Store plugin (and the badger Index plugin) with gRPC
// interceptors that crash, hang or answer garbage on demand, so the host's
// supervision tests can make a real plugin process misbehave.
//
// Faults are chosen by environment variables, which the host's process
// environment passes down (tests set them with t.Setenv):
//
//	KVTIER_FAULT_CRASH_ON_PUT=N      exit abruptly inside the Nth Put call, after
//	                                 the store accepted the batch, before replying
//	KVTIER_FAULT_HANG_ON_GET=N       block forever in the Nth Get call
//	KVTIER_FAULT_GARBAGE_GET=N       answer the Nth Get with a reply of the wrong length
//	KVTIER_FAULT_GARBAGE_ACKS=N      send the Nth ack batch with an unset stage
//	KVTIER_FAULT_GARBAGE_INDEX_GET=N answer the Nth index Get with too few results
//	KVTIER_FAULT_DROP_ACKS=1         never send an ack (every call still answers)
//	KVTIER_FAULT_NO_SLAB=1           claim in Open that the slab is not mapped
//	KVTIER_FAULT_STDOUT_MARKER=path  print to stdout before the handshake if path exists
//	KVTIER_FAULT_STDOUT_ALWAYS=1     print to stdout before the handshake
//	KVTIER_FAULT_HANG_AT_START=1     never reach the handshake
//	KVTIER_FAULT_HANG_AT_START_MARKER=path
//	                                 if path exists: append this process's pid to
//	                                 path.pids, start a child (sleep) that holds
//	                                 stdout, and never reach the handshake
//	KVTIER_FAULT_SLOW_GET=N          in the Nth Get call, sleep KVTIER_FAULT_SLOW_GET_SLEEP
//	                                 (a Go duration, default 1s), then keep writing
//	                                 0xEE over every destination span of the request
//	                                 for KVTIER_FAULT_SLOW_GET_WRITE (default 1s), both
//	                                 itself and from a child process it starts (as a
//	                                 plugin's I/O worker would), then serve the Get:
//	                                 a plugin that is slow, not dead
//
// Counters start at 1 in each process, so a restarted plugin misbehaves
// again at its own Nth call.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/badger"
	"github.com/kvtier/kvtier/plugins/internal/wire"
	"github.com/kvtier/kvtier/plugins/proto/indexv1"
	"github.com/kvtier/kvtier/plugins/proto/storev1"
	"github.com/kvtier/kvtier/plugins/sdk"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/memstore"
)

func envInt(name string) int64 {
	n, _ := strconv.ParseInt(os.Getenv(name), 10, 64)
	return n
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return d
	}
	return def
}

type faults struct {
	crashOnPut, hangOnGet, garbageGet, garbageAcks int64
	garbageIndexGet, slowGet                       int64
	slowGetSleep, slowGetWrite                     time.Duration
	noSlab, dropAcks                               bool
	puts, gets, ackBatches, indexGets              atomic.Int64
	slab                                           atomic.Pointer[tiers.Slab] // set at Open
}

func main() {
	if w := os.Getenv(writerEnv); w != "" {
		os.Exit(runWriter(w))
	}
	if os.Getenv("KVTIER_FAULT_HANG_AT_START") != "" {
		select {} // the fault under test: only the host's start timeout ends this
	}
	if m := os.Getenv("KVTIER_FAULT_HANG_AT_START_MARKER"); m != "" {
		if _, err := os.Stat(m); err == nil {
			hangHoldingStdout(m)
		}
	}
	if os.Getenv("KVTIER_FAULT_STDOUT_ALWAYS") != "" {
		fmt.Println("faultplugin: hello from stdout") // the fault under test
	}
	if m := os.Getenv("KVTIER_FAULT_STDOUT_MARKER"); m != "" {
		if _, err := os.Stat(m); err == nil {
			fmt.Println("faultplugin: hello from stdout") // the fault under test
		}
	}
	f := &faults{
		crashOnPut:      envInt("KVTIER_FAULT_CRASH_ON_PUT"),
		hangOnGet:       envInt("KVTIER_FAULT_HANG_ON_GET"),
		garbageGet:      envInt("KVTIER_FAULT_GARBAGE_GET"),
		garbageAcks:     envInt("KVTIER_FAULT_GARBAGE_ACKS"),
		garbageIndexGet: envInt("KVTIER_FAULT_GARBAGE_INDEX_GET"),
		slowGet:         envInt("KVTIER_FAULT_SLOW_GET"),
		slowGetSleep:    envDuration("KVTIER_FAULT_SLOW_GET_SLEEP", time.Second),
		slowGetWrite:    envDuration("KVTIER_FAULT_SLOW_GET_WRITE", time.Second),
		noSlab:          os.Getenv("KVTIER_FAULT_NO_SLAB") != "",
		dropAcks:        os.Getenv("KVTIER_FAULT_DROP_ACKS") != "",
	}
	sdk.Serve(sdk.Plugin{
		Name:    "faultplugin",
		Version: "test",
		OpenStore: func(_ context.Context, env tiers.Env, config []byte) (tiers.Store, error) {
			cfg := memstore.DefaultConfig()
			if err := sdk.DecodeConfig(config, &cfg); err != nil {
				return nil, err
			}
			f.slab.Store(&env.Slab)
			return memstore.Open(env, cfg)
		},
		OpenIndex: func(ctx context.Context, env indexes.Env, config []byte) (indexes.Index, error) {
			cfg := badger.DefaultConfig()
			if err := sdk.DecodeConfig(config, &cfg); err != nil {
				return nil, err
			}
			return badger.Open(ctx, env, cfg)
		},
		ServerOptions: []grpc.ServerOption{
			grpc.ChainUnaryInterceptor(f.unary),
			grpc.ChainStreamInterceptor(f.stream),
		},
	})
}

func (f *faults) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	switch info.FullMethod {
	case indexv1.Index_Get_FullMethodName:
		n := f.indexGets.Add(1)
		reply, err := handler(ctx, req)
		if n == f.garbageIndexGet && err == nil {
			r := reply.(*indexv1.GetReply)
			for _, l := range r.Results {
				l.Found, l.Record = true, &indexv1.Record{Slot: 666} // claim hits...
			}
			r.Results = r.Results[:len(r.Results)/2] // ...in a reply of the wrong length
		}
		return reply, err
	case storev1.Store_Open_FullMethodName:
		reply, err := handler(ctx, req)
		if err == nil && f.noSlab {
			reply.(*storev1.OpenReply).SlabMapped = false
		}
		return reply, err
	case storev1.Store_Put_FullMethodName:
		n := f.puts.Add(1)
		reply, err := handler(ctx, req)
		if n == f.crashOnPut {
			// The store has the batch; the host never hears back.
			os.Exit(3)
		}
		return reply, err
	case storev1.Store_Get_FullMethodName:
		n := f.gets.Add(1)
		if n == f.hangOnGet {
			select {} // hang: only the host's deadline ends this
		}
		if n == f.slowGet {
			f.lateWrites(req.(*storev1.GetRequest))
		}
		reply, err := handler(ctx, req)
		if n == f.garbageGet && err == nil {
			r := reply.(*storev1.GetReply)
			for _, it := range r.Results {
				it.Code = storev1.ResultCode_RESULT_CODE_OK // claim hits...
			}
			r.Results = r.Results[:len(r.Results)/2] // ...in a reply of the wrong length
		}
		return reply, err
	}
	return handler(ctx, req)
}

func (f *faults) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod == storev1.Store_Acks_FullMethodName && (f.garbageAcks > 0 || f.dropAcks) {
		return handler(srv, &garbageAcks{ServerStream: ss, f: f})
	}
	return handler(srv, ss)
}

type garbageAcks struct {
	grpc.ServerStream
	f *faults
}

// SendMsg drops or garbles ack batches as the faults say.
func (g *garbageAcks) SendMsg(m any) error {
	if g.f.dropAcks {
		return nil // the fault under test: acks vanish
	}
	if b, ok := m.(*storev1.AckBatch); ok && g.f.ackBatches.Add(1) == g.f.garbageAcks && len(b.Acks) > 0 {
		b.Acks[0].Stage = storev1.AckStage_ACK_STAGE_UNSPECIFIED
	}
	return g.ServerStream.SendMsg(m)
}

// hangHoldingStdout is the fault of a plugin wrapper that never completes
// the handshake and leaves a child holding its stdout: go-plugin reads
// stdout until every holder closes it.
func hangHoldingStdout(marker string) {
	f, err := os.OpenFile(marker+".pids", os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err == nil {
		fmt.Fprintln(f, os.Getpid())
		f.Close()
	}
	sleep, err := exec.LookPath("sleep")
	if err == nil {
		child := exec.Command(sleep, "3600")
		child.Stdout = os.Stdout
		_ = child.Start()
	}
	select {} // the fault under test: the host must kill the whole group
}

// lateWrites sleeps past the host's call deadline and then writes garbage
// over the request's destination spans for a while, as a plugin that is
// slow rather than stopped would write pages the host may have reused.
func (f *faults) lateWrites(req *storev1.GetRequest) {
	time.Sleep(f.slowGetSleep)
	sp := f.slab.Load()
	if sp == nil {
		return
	}
	slab := *sp
	end := time.Now().Add(f.slowGetWrite)
	job := writerJob{UntilUnixNano: end.UnixNano()}
	files := slab.Geometry().Slabs
	for _, it := range req.GetItems() {
		dst, err := wire.FromSpan(it.GetDst())
		if err != nil || int(dst.Slab) >= len(files) {
			continue
		}
		job.Spans = append(job.Spans, writerSpan{Path: files[dst.Slab].Path, Offset: dst.Offset, Length: dst.Length})
	}
	if self, err := os.Executable(); err == nil {
		b, _ := json.Marshal(job)
		child := exec.Command(self)
		child.Env = append(os.Environ(), writerEnv+"="+string(b))
		_ = child.Start() // stdout and stderr: /dev/null, so it holds no pipe of the host's
		defer func() { go child.Wait() }()
	}
	for ; time.Now().Before(end); time.Sleep(time.Millisecond) {
		for _, it := range req.GetItems() {
			dst, err := wire.FromSpan(it.GetDst())
			if err != nil {
				continue
			}
			b, err := slab.Bytes(dst)
			if err != nil {
				continue
			}
			for i := range b {
				b[i] = 0xEE
			}
		}
	}
}

// writerEnv carries a writer child's job: which spans of which slab files
// to overwrite, and until when.
const writerEnv = "KVTIER_FAULT_WRITER_JOB"

type writerJob struct {
	UntilUnixNano int64
	Spans         []writerSpan
}

type writerSpan struct {
	Path           string
	Offset, Length int64
}

// runWriter is the child of a slow Get: it maps the slab files itself and
// overwrites the spans with 0xEE until the job's end. It returns the exit
// code.
func runWriter(raw string) int {
	var job writerJob
	if err := json.Unmarshal([]byte(raw), &job); err != nil {
		fmt.Fprintln(os.Stderr, "faultplugin writer:", err)
		return 2
	}
	maps := map[string][]byte{}
	for _, sp := range job.Spans {
		if _, ok := maps[sp.Path]; ok {
			continue
		}
		f, err := os.OpenFile(sp.Path, os.O_RDWR, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "faultplugin writer:", err)
			return 2
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return 2
		}
		m, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
		f.Close()
		if err != nil {
			fmt.Fprintln(os.Stderr, "faultplugin writer:", err)
			return 2
		}
		maps[sp.Path] = m
	}
	for time.Now().UnixNano() < job.UntilUnixNano {
		for _, sp := range job.Spans {
			m := maps[sp.Path]
			if sp.Offset < 0 || sp.Length < 0 || sp.Offset+sp.Length > int64(len(m)) {
				continue
			}
			for i := range m[sp.Offset : sp.Offset+sp.Length] {
				m[sp.Offset+int64(i)] = 0xEE
			}
		}
		time.Sleep(time.Millisecond)
	}
	return 0
}

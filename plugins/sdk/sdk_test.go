package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/badger"
	"github.com/kvtier/kvtier/internal/slabfile"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/plugins/internal/wire"
	"github.com/kvtier/kvtier/plugins/proto/indexv1"
	"github.com/kvtier/kvtier/plugins/proto/storev1"
	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/memstore"
)

const pageBytes = 8192

// serve runs register's services on a unix socket and returns a client
// connection; both end with the test.
func serve(t *testing.T, register func(*grpc.Server)) *grpc.ClientConn {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	register(srv)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func memstorePlugin() Plugin {
	return Plugin{Name: "memstore", Version: "test", OpenStore: func(_ context.Context, env tiers.Env, cfg []byte) (tiers.Store, error) {
		c := memstore.DefaultConfig()
		if err := DecodeConfig(cfg, &c); err != nil {
			return nil, err
		}
		return memstore.Open(env, c)
	}}
}

func openRequest(slab tiers.Slab) *storev1.OpenRequest {
	return &storev1.OpenRequest{
		Name: "t", StackId: "s", Rank: 0, WorldSize: 1,
		Payload:    wire.Payload(tiers.PayloadGeometry{PageTokens: 4, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: pageBytes}}}),
		Slab:       wire.Slab(slab.Geometry()),
		ColdStart:  storev1.ColdStart_COLD_START_CLEAR,
		ConfigJson: []byte(`{"capacity": "1MiB"}`),
	}
}

func key(i int) *storev1.Key {
	h := pagehash.Next(pagehash.Root, []uint32{uint32(i)})
	return &storev1.Key{Hash: h[:], Kind: 0}
}

// TestStoreServer drives the store service as a host would: concurrent
// puts under host batch ids, acks translated back to them, gets through the
// shared slab, and Close delivering the last acks before the stream ends.
func TestStoreServer(t *testing.T) {
	slab, err := slabfile.Open(context.Background(), nil, t.TempDir(), "s", 64*pageBytes, false)
	if err != nil {
		t.Fatal(err)
	}
	defer slab.Close()
	srv := newStoreServer(memstorePlugin(), slog.New(slog.DiscardHandler))
	c := storev1.NewStoreClient(serve(t, func(s *grpc.Server) { storev1.RegisterStoreServer(s, srv) }))
	ctx := context.Background()
	if _, err := c.Put(ctx, &storev1.PutRequest{Batch: 1}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("put before open: %v, want FAILED_PRECONDITION", err)
	}
	reply, err := c.Open(ctx, openRequest(slab))
	if err != nil || !reply.GetSlabMapped() || reply.GetImplementation() != "memstore test" {
		t.Fatalf("open: %v %v", reply, err)
	}
	if _, err := c.Open(ctx, openRequest(slab)); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("second open: %v", err)
	}
	// Protocol 1.1: memstore keeps no checksums, so the plugin does not
	// claim keeps_put_sums, and a put item that carries a sum anyway is
	// refused whole.
	if reply.GetKeepsPutSums() {
		t.Fatalf("open: keeps_put_sums from a store that keeps no checksums")
	}
	withSum := &storev1.PutRequest{Batch: 99, Items: []*storev1.PutItem{{Key: key(0), Src: &storev1.Span{Length: pageBytes}, Sum: 1, HasSum: true}}}
	if _, err := c.Put(ctx, withSum); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "keeps_put_sums") {
		t.Fatalf("put with a sum the plugin did not ask for: %v, want INVALID_ARGUMENT naming keeps_put_sums", err)
	}
	stream, err := c.Acks(ctx, &storev1.AcksRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// Write page contents into slots 0..31 and put them in 8 concurrent
	// batches with host ids 100..107.
	for i := range 32 {
		b, _ := slab.Bytes(tiers.Span{Offset: int64(i) * pageBytes, Length: pageBytes})
		for j := range b {
			b[j] = byte(i + j)
		}
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := &storev1.PutRequest{Batch: uint64(100 + w)}
			for i := range 4 {
				slot := w*4 + i
				req.Items = append(req.Items, &storev1.PutItem{Key: key(slot), Src: &storev1.Span{Offset: int64(slot) * pageBytes, Length: pageBytes}})
			}
			if _, err := c.Put(ctx, req); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	durable := map[uint64]int{}
	for total := 0; total < 32; {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range msg.GetAcks() {
			if a.GetBatch() < 100 || a.GetBatch() > 107 {
				t.Fatalf("ack under batch %d: the store's own id leaked", a.GetBatch())
			}
			if a.GetStage() == storev1.AckStage_ACK_STAGE_DURABLE {
				durable[a.GetBatch()]++
				total++
			}
		}
	}
	for b, n := range durable {
		if n != 4 {
			t.Fatalf("batch %d: %d durable acks", b, n)
		}
	}
	// Read slot 5's page into slot 40.
	get := &storev1.GetRequest{Items: []*storev1.GetItem{
		{Key: key(5), Dst: &storev1.Span{Offset: 40 * pageBytes, Length: pageBytes}},
		{Key: key(999), Dst: &storev1.Span{Offset: 41 * pageBytes, Length: pageBytes}},
	}}
	gr, err := c.Get(ctx, get)
	if err != nil {
		t.Fatal(err)
	}
	if gr.Results[0].GetCode() != storev1.ResultCode_RESULT_CODE_OK || gr.Results[1].GetCode() != storev1.ResultCode_RESULT_CODE_MISS {
		t.Fatalf("get results %v", gr.Results)
	}
	src, _ := slab.Bytes(tiers.Span{Offset: 5 * pageBytes, Length: pageBytes})
	dst, _ := slab.Bytes(tiers.Span{Offset: 40 * pageBytes, Length: pageBytes})
	if !bytes.Equal(src, dst) {
		t.Fatal("the plugin side did not write the page into the shared slab")
	}
	// Malformed requests are INVALID_ARGUMENT.
	for name, req := range map[string]*storev1.GetRequest{
		"short hash": {Items: []*storev1.GetItem{{Key: &storev1.Key{Hash: []byte{1}}, Dst: &storev1.Span{Length: pageBytes}}}},
		"bad kind":   {Items: []*storev1.GetItem{{Key: &storev1.Key{Hash: key(1).Hash, Kind: 1}, Dst: &storev1.Span{Length: pageBytes}}}},
		"bad span":   {Items: []*storev1.GetItem{{Key: key(1), Dst: &storev1.Span{Offset: 1 << 40, Length: pageBytes}}}},
	} {
		if _, err := c.Get(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("get with %s: %v, want INVALID_ARGUMENT", name, err)
		}
	}
	if lp, err := c.LongestPrefix(ctx, &storev1.LongestPrefixRequest{Kind: 0, Chain: [][]byte{key(0).Hash, key(1).Hash, key(999).Hash, key(2).Hash}}); err != nil || lp.GetPresent() != 2 {
		t.Fatalf("longest prefix: %v %v", lp, err)
	}
	st, err := c.Stats(ctx, &storev1.StatsRequest{})
	if err != nil || st.GetPages() != 32 || st.GetHits() != 1 || st.GetMisses() != 1 {
		t.Fatalf("stats: %v %v", st, err)
	}
	if _, err := c.Close(ctx, &storev1.CloseRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("ack stream after close: %v, want EOF", err)
	}
	if _, err := c.Get(ctx, get); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("get after close: %v, want FAILED_PRECONDITION", err)
	}
}

func TestStoreServerSlabUnmappable(t *testing.T) {
	srv := newStoreServer(memstorePlugin(), slog.New(slog.DiscardHandler))
	c := storev1.NewStoreClient(serve(t, func(s *grpc.Server) { storev1.RegisterStoreServer(s, srv) }))
	slab, err := slabfile.Open(context.Background(), nil, t.TempDir(), "s", 8*pageBytes, false)
	if err != nil {
		t.Fatal(err)
	}
	req := openRequest(slab)
	slab.Close() // removes the files and the lock
	reply, err := c.Open(context.Background(), req)
	if err != nil || reply.GetSlabMapped() {
		t.Fatalf("open over a missing slab file: %v %v, want slab_mapped=false", reply, err)
	}
}

func TestIndexServer(t *testing.T) {
	p := Plugin{Name: "badger", OpenIndex: func(ctx context.Context, env indexes.Env, cfg []byte) (indexes.Index, error) {
		c := badger.DefaultConfig()
		if err := DecodeConfig(cfg, &c); err != nil {
			return nil, err
		}
		return badger.Open(ctx, env, c)
	}}
	srv := newIndexServer(p, slog.New(slog.DiscardHandler))
	c := indexv1.NewIndexClient(serve(t, func(s *grpc.Server) { indexv1.RegisterIndexServer(s, srv) }))
	ctx := context.Background()
	if _, err := c.Open(ctx, &indexv1.OpenRequest{Name: "i", Dir: t.TempDir(), ConfigJson: []byte(`{"sync": false}`)}); err != nil {
		t.Fatal(err)
	}
	var entries []*indexv1.Entry
	for i := range 2500 {
		entries = append(entries, &indexv1.Entry{Key: &indexv1.Key{Hash: key(i).Hash}, Record: &indexv1.Record{Slot: uint64(i), Epoch: 1}})
	}
	if _, err := c.Put(ctx, &indexv1.PutRequest{Entries: entries}); err != nil {
		t.Fatal(err)
	}
	it, err := c.Iterate(ctx, &indexv1.IterateRequest{BatchSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int
	for {
		b, err := it.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(b.GetEntries()))
	}
	if len(sizes) != 3 || sizes[0] != 1000 || sizes[2] != 500 {
		t.Fatalf("iterate batches %v, want 1000, 1000, 500", sizes)
	}
	if _, err := c.Put(ctx, &indexv1.PutRequest{Entries: []*indexv1.Entry{{Key: &indexv1.Key{Hash: []byte{1}}, Record: &indexv1.Record{}}}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("put of a malformed key: %v", err)
	}
	if _, err := c.Close(ctx, &indexv1.CloseRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stats(ctx, &indexv1.StatsRequest{}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("stats after close: %v", err)
	}
}

// TestAckRelayEarlyAcks: acks the store queues before Put has bound its id
// wait, and are sent under the host's id once bound.
func TestAckRelayEarlyAcks(t *testing.T) {
	r := newAckRelay()
	logger := slog.New(slog.DiscardHandler)
	early := []tiers.Ack{{Batch: 3, Index: 0, Stage: tiers.AckGathered}, {Batch: 3, Index: 0, Stage: tiers.AckDurable}}
	if out := r.translate(early, logger); len(out) != 0 {
		t.Fatalf("unbound acks sent: %v", out)
	}
	r.bind(3, 42, 1)
	select {
	case <-r.ready:
	default:
		t.Fatal("bind did not signal the released acks")
	}
	out := r.translate(nil, logger)
	if len(out) != 2 || out[0].GetBatch() != 42 || out[1].GetStage() != storev1.AckStage_ACK_STAGE_DURABLE {
		t.Fatalf("released acks %v", out)
	}
	if len(r.batches) != 0 {
		t.Fatalf("a finished batch is still mapped: %v", r.batches)
	}
	r.bind(4, 43, 1)
	out = r.translate([]tiers.Ack{{Batch: 4, Index: 0, Stage: tiers.AckFailed, Err: tiers.ErrFull}}, logger)
	if len(out) != 1 || out[0].GetCode() != storev1.ResultCode_RESULT_CODE_FULL {
		t.Fatalf("failed ack %v, want code FULL", out)
	}
}

func TestCommonVersion(t *testing.T) {
	cases := []struct {
		offer string
		ok    bool
		err   bool
	}{
		{"", true, false},
		{"1", true, false},
		{"2,1", true, false},
		{"2,3", false, false},
		{"x", false, true},
	}
	for _, c := range cases {
		_, ok, err := commonVersion(c.offer, []int{1})
		if ok != c.ok || (err != nil) != c.err {
			t.Errorf("offer %q: ok %v err %v", c.offer, ok, err)
		}
	}
}

type testConfig struct {
	Capacity quantity.Size `yaml:"capacity"`
	Name     string        `yaml:"name"`
	Sync     bool          `yaml:"sync_writes"`
}

func (c *testConfig) Validate() error {
	if c.Capacity < 0 {
		return errors.New("capacity must not be negative")
	}
	return nil
}

func TestDecodeConfig(t *testing.T) {
	cases := []struct {
		in   string
		want testConfig
		bad  bool
	}{
		{"", testConfig{Capacity: 7}, false},
		{"null", testConfig{Capacity: 7}, false},
		{`{"capacity": "2KiB", "name": "a", "sync_writes": true}`, testConfig{Capacity: 2048, Name: "a", Sync: true}, false},
		{`{"capacity": 5}`, testConfig{Capacity: 5}, false},
		{`{"capacity": -5}`, testConfig{}, true},
		{`{"unknown": 1}`, testConfig{}, true},
		{`{"SyncWrites": true}`, testConfig{}, true},
		{`[1, 2]`, testConfig{}, true},
		{`{"capacity": "lots"}`, testConfig{}, true},
	}
	for _, c := range cases {
		got := testConfig{Capacity: 7}
		err := DecodeConfig([]byte(c.in), &got)
		if (err != nil) != c.bad {
			t.Errorf("%s: err %v, bad want %v", c.in, err, c.bad)
			continue
		}
		if !c.bad && got != c.want {
			t.Errorf("%s: decoded %+v, want %+v", c.in, got, c.want)
		}
	}
}

func FuzzDecodeConfig(f *testing.F) {
	for _, s := range []string{`{"capacity": "2KiB"}`, "null", `{"name": "x", "sync_writes": false}`, `{`, `{"capacity": {"a": 1}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var c testConfig
		if err := DecodeConfig(b, &c); err == nil && c.Capacity < 0 {
			t.Fatalf("accepted a negative capacity from %q", b)
		}
	})
}

// TestLoggerSpeaksHclogJSON: the SDK's log lines carry the keys go-plugin's
// host parses, with a timestamp in the one layout it accepts.
func TestLoggerSpeaksHclogJSON(t *testing.T) {
	var buf bytes.Buffer
	NewLogger(&buf, slog.LevelDebug).Warn("disk slow", "ms", 12, slog.Group("g", "a", 1))
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatalf("%s: %v", buf.String(), err)
	}
	if m["@level"] != "warn" || m["@message"] != "disk slow" || m["ms"] != float64(12) {
		t.Fatalf("log line %s", buf.String())
	}
	if _, err := time.Parse(hclogTimeFormat, m["@timestamp"].(string)); err != nil {
		t.Fatalf("timestamp %v: %v", m["@timestamp"], err)
	}
	for l, want := range map[slog.Level]string{slog.LevelDebug - 4: "trace", slog.LevelDebug: "debug", slog.LevelInfo: "info", slog.LevelError + 2: "error"} {
		if got := hclogLevel(l); got != want {
			t.Errorf("level %v -> %s, want %s", l, got, want)
		}
	}
}

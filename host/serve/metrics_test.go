package serve

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/pagehash"
)

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestMetricsScrape scrapes /metrics with the Prometheus text parser while
// an engine runs requests, and checks /healthz and /readyz.
func TestMetricsScrape(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sd, err := os.MkdirTemp("", "kvs")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sd)
	sock, maddr := filepath.Join(sd, "s.sock"), freePort(t)
	s, err := Open(ctx, Config{DataDir: t.TempDir(), Socket: sock, Metrics: maddr})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	get := func(path string) (int, string) {
		for i := 0; ; i++ {
			resp, err := http.Get("http://" + maddr + path)
			if err != nil {
				if i > 200 {
					t.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond)
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp.StatusCode, string(b)
		}
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	for i := 0; ; i++ {
		if code, _ := get("/readyz"); code == 200 {
			break
		} else if i > 200 {
			t.Fatalf("/readyz %d", code)
		}
		time.Sleep(10 * time.Millisecond)
	}
	e := dialEngine(t, sock, 0, 1)
	if err := e.register(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		drive(t, ctx, e, reqName(i), chain("p", 3, 6, reqName(i)))
		if i == 5 {
			// A bad item, to be counted.
			e.run(ctx, &pb.StepRequest{Finished: []*pb.Finish{{ReqId: "nope"}}}, nil)
		}
	}
	_, text := get("/metrics")
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	val := func(name string, labels map[string]string) float64 {
		f := fams[name]
		if f == nil {
			t.Fatalf("no metric %s", name)
		}
		for _, m := range f.Metric {
			if match(m, labels) {
				switch {
				case m.Counter != nil:
					return m.Counter.GetValue()
				case m.Gauge != nil:
					return m.Gauge.GetValue()
				case m.Histogram != nil:
					return float64(m.Histogram.GetSampleCount())
				}
			}
		}
		t.Fatalf("no %s with %v", name, labels)
		return 0
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		min    float64
	}{
		{"kvtier_steps_total", map[string]string{"rank": "0"}, 20},
		{"kvtier_step_duration_seconds", map[string]string{"rank": "0"}, 20},
		{"kvtier_group_exchange_duration_seconds", map[string]string{"rank": "0"}, 20},
		{"kvtier_tier_hits_total", map[string]string{"rank": "0", "tier": "l1"}, 27},
		{"kvtier_lookup_pages_total", map[string]string{"rank": "0", "outcome": "hit"}, 27},
		{"kvtier_tier_bytes_total", map[string]string{"tier": "l2", "direction": "in"}, 1},
		{"kvtier_tier_capacity_pages", map[string]string{"tier": "l1"}, 256},
		{"kvtier_item_errors_total", map[string]string{"code": "unknown"}, 1},
		{"kvtier_sessions", nil, 1},
		{"kvtier_ticks_total", map[string]string{"rank": "0"}, 20},
	} {
		if v := val(tc.name, tc.labels); v < tc.min {
			t.Errorf("%s%v = %v, want at least %v", tc.name, tc.labels, v, tc.min)
		}
	}
	for name := range fams {
		if strings.HasPrefix(name, "kvtier_") && fams[name].GetType() == dto.MetricType_COUNTER && !strings.HasSuffix(name, "_total") {
			t.Errorf("counter %s does not end in _total", name)
		}
	}
}

func match(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.Label {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// scrape is one parsed /metrics page.
type scrape map[string]*dto.MetricFamily

func scrapeMetrics(t *testing.T, addr string) scrape {
	t.Helper()
	var resp *http.Response
	var err error
	for i := 0; ; i++ {
		if resp, err = http.Get("http://" + addr + "/metrics"); err == nil {
			break
		}
		if i > 200 {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// labelKey names a series of a family by its sorted labels.
func labelKey(m *dto.Metric) string {
	var b strings.Builder
	for _, l := range m.Label { // the parser sorts them
		b.WriteString(l.GetName() + "=" + l.GetValue() + ",")
	}
	return b.String()
}

// counters returns every counter series (and histogram count) of s by
// family and labels.
func (s scrape) counters() map[string]float64 {
	out := map[string]float64{}
	for name, f := range s {
		for _, m := range f.Metric {
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out[name+"{"+labelKey(m)+"}"] = m.Counter.GetValue()
			case dto.MetricType_HISTOGRAM:
				out[name+"_count{"+labelKey(m)+"}"] = float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return out
}

// value returns the series of name whose labels include want (0 when
// there is none).
func (s scrape) value(name string, want map[string]string) float64 {
	f := s[name]
	if f == nil {
		return 0
	}
	for _, m := range f.Metric {
		if match(m, want) {
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			}
		}
	}
	return 0
}

// TestMetricsMonotonic scrapes /metrics before and after each way a
// session ends (Close, a new Register, the connection dropping, a group
// stopped by a digest mismatch, TTL expiry) on two ranks whose group
// transport is the engine, and checks every counter series of the earlier
// scrape against the later one: none goes back (each end starts a new
// epoch with new Nodes and Machines), and the ones the end is about went
// up. It also checks that a PENDING lookup shows in kvtier_held_requests
// and that the in-flight gauge has a tier label.
func TestMetricsMonotonic(t *testing.T) {
	ctx := context.Background()
	maddr := freePort(t)
	_, sock, _ := startWith(t, Config{DataDir: t.TempDir(), Ranks: 2, Group: GroupEngine, Metrics: maddr, SessionTTL: 3 * time.Second})
	es := []*testEngine{dialEngine(t, sock, 0, 2), dialEngine(t, sock, 1, 2)}
	register := func() {
		t.Helper()
		for _, e := range es {
			if err := e.register(ctx); err != nil {
				t.Fatal(err)
			}
			e.engineGroup = true
		}
	}
	keys := make([][]pagehash.Hash, 8)
	for i := range keys {
		keys[i] = chain(fmt.Sprintf("mono-%d", i), 6, 8, fmt.Sprintf("t%d", i))
	}
	round := 0
	work := func() {
		t.Helper()
		round++
		driveKeys(t, ctx, es, fmt.Sprintf("w%d-", round), keys)
	}
	// waitEnd waits until rank's session is gone: its next step names
	// the session unknown.
	waitEnd := func(rank int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			out, err := es[rank].run(ctx, &pb.StepRequest{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(out.Errors) > 0 && out.Errors[0].Item == "session" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("rank %d's session did not end: %v", rank, out)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	ends := func(s scrape, rank, why string) float64 {
		return s.value("kvtier_session_ends_total", map[string]string{"rank": rank, "why": why})
	}
	check := func(step string, before, after scrape, up ...string) {
		t.Helper()
		a := after.counters()
		for k, v := range before.counters() {
			w, ok := a[k]
			if !ok {
				t.Errorf("%s: series %s vanished", step, k)
				continue
			}
			if w < v {
				t.Errorf("%s: counter %s went back from %v to %v", step, k, v, w)
			}
		}
		for _, k := range up {
			if a[k] <= before.counters()[k] {
				t.Errorf("%s: %s did not increase (%v)", step, k, a[k])
			}
		}
	}

	register()
	work()
	work()
	s0 := scrapeMetrics(t, maddr)
	if s0.value("kvtier_ticks_total", map[string]string{"rank": "0"}) == 0 || s0.value("kvtier_tier_bytes_total", map[string]string{"rank": "0", "tier": "l2", "direction": "in"}) == 0 {
		t.Fatal("no ticks or no L2 bytes after two rounds")
	}
	if s0.value("kvtier_digest_checks_total", map[string]string{"rank": "0"}) == 0 {
		t.Fatal("no digest checked in the first epoch (tick 0 is a digest tick)")
	}
	for _, tier := range []string{"l1", "l3"} {
		found := false
		for _, m := range s0["kvtier_tier_inflight_operations"].GetMetric() {
			found = found || match(m, map[string]string{"rank": "0", "tier": tier})
		}
		if !found {
			t.Errorf("no kvtier_tier_inflight_operations{tier=%q}", tier)
		}
	}

	// 1. Close: rank 0's session closed, rank 1's ended with the group.
	if _, err := es[0].cl.Close(ctx, &pb.CloseRequest{Session: es[0].reg.Session, BootId: es[0].reg.BootId}); err != nil {
		t.Fatal(err)
	}
	waitEnd(1)
	s1 := scrapeMetrics(t, maddr)
	check("close", s0, s1, `kvtier_session_ends_total{rank=0,why=closed,}`, `kvtier_session_ends_total{rank=1,why=group_ended,}`)

	// A new epoch: a key stored earlier is in L3 only, so its lookup is
	// PENDING in the first reply, and held_requests counts it.
	register()
	outs := stepAll(t, ctx, es, func() *pb.StepRequest {
		return &pb.StepRequest{Lookups: []*pb.Lookup{{ReqId: "held", Pages: 8, Hashes: packHashes(keys[0])}}}
	}, nil)
	if st := outs[0].Lookups[0].Status; st == pb.LookupStatus_LOOKUP_STATUS_PENDING {
		if h := scrapeMetrics(t, maddr).value("kvtier_held_requests", map[string]string{"rank": "0"}); h < 1 {
			t.Errorf("a lookup is PENDING and kvtier_held_requests is %v", h)
		}
	} else {
		t.Errorf("a lookup of L3-only pages is %v in its first reply, want PENDING", st)
	}
	for n := 0; ; n++ {
		outs = stepAll(t, ctx, es, func() *pb.StepRequest { return &pb.StepRequest{} }, nil)
		if len(outs[0].Lookups) > 0 && outs[0].Lookups[0].Status == pb.LookupStatus_LOOKUP_STATUS_DONE {
			es[0].verify(outs[0].Lookups[0], keys[0])
			break
		}
		if n > 200 {
			t.Fatal("the held lookup never finished")
		}
	}
	stepAll(t, ctx, es, func() *pb.StepRequest { return &pb.StepRequest{Finished: []*pb.Finish{{ReqId: "held"}}} }, nil)
	work()

	// 2. A new Register for rank 0 replaces its session.
	if err := es[0].register(ctx); err != nil {
		t.Fatal(err)
	}
	waitEnd(1)
	s2 := scrapeMetrics(t, maddr)
	check("replace", s1, s2, `kvtier_session_ends_total{rank=0,why=replaced,}`, `kvtier_session_ends_total{rank=1,why=group_ended,}`)

	// 3. Rank 0's connection drops.
	register()
	work()
	es[0].conn.Close()
	waitEnd(1)
	s3 := scrapeMetrics(t, maddr)
	check("disconnect", s2, s3, `kvtier_session_ends_total{rank=0,why=disconnected,}`)
	es[0] = dialEngine(t, sock, 0, 2)

	// 4. A digest mismatch: the frontier of a digest tick (a new
	// epoch's tick 0) with another digest stops the group, twice.
	for range 2 {
		register()
		stepAll(t, ctx, es, func() *pb.StepRequest { return &pb.StepRequest{} }, nil)
		bad := damagedDigest(t, es[0].frontier)
		out, err := es[0].run(ctx, &pb.StepRequest{Frontier: bad}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Errors) == 0 || out.Errors[0].Code != pb.ErrorCode_ERROR_CODE_UNAVAILABLE || !strings.Contains(out.Errors[0].Message, "digests differ") {
			t.Fatalf("a frontier with another digest: %v, want UNAVAILABLE naming the digests", out.Errors)
		}
		waitEnd(1)
	}
	s4 := scrapeMetrics(t, maddr)
	check("mismatch", s3, s4, `kvtier_session_ends_total{rank=0,why=group_stopped,}`, `kvtier_digest_mismatches_total{rank=0,}`)
	if d := s4.value("kvtier_digest_mismatches_total", map[string]string{"rank": "0"}) - s3.value("kvtier_digest_mismatches_total", map[string]string{"rank": "0"}); d != 2 {
		t.Errorf("2 mismatches counted as %v", d)
	}

	// 5. TTL: both ranks fall silent.
	register()
	work()
	deadline := time.Now().Add(15 * time.Second)
	for ends(scrapeMetrics(t, maddr), "0", "expired")+ends(scrapeMetrics(t, maddr), "1", "expired") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no session expired")
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitEnd(0)
	waitEnd(1)
	s5 := scrapeMetrics(t, maddr)
	check("expiry", s4, s5)
	check("whole run", s0, s5, `kvtier_ticks_total{rank=0,}`, `kvtier_ticks_total{rank=1,}`, `kvtier_digest_checks_total{rank=0,}`,
		`kvtier_tier_bytes_total{direction=out,rank=0,tier=l3,}`, `kvtier_tier_bytes_total{direction=out,rank=0,tier=l2,}`, `kvtier_steps_total{rank=0,}`)
	if es[0].wrong+es[1].wrong != 0 {
		t.Fatalf("%d+%d wrong pages", es[0].wrong, es[1].wrong)
	}
}

// damagedDigest returns an encoded frontier of a digest tick with its
// replicated-state digest changed (fault injection: the ranks disagree).
func damagedDigest(t *testing.T, frontier []byte) []byte {
	t.Helper()
	if len(frontier) < 40 {
		t.Fatalf("a frontier of %d bytes", len(frontier))
	}
	le := binary.LittleEndian // the header's group, stack and size (consensus's codec)
	env, f, err := consensus.DecodeFrontier(frontier, consensus.Expect{Group: le.Uint64(frontier[8:]), Stack: le.Uint64(frontier[16:]), Size: int(le.Uint32(frontier[36:]))})
	if err != nil {
		t.Fatal(err)
	}
	if !f.Shape.Digest {
		t.Fatalf("the frontier of tick %d carries no digest", f.Tick)
	}
	f.Digest[0] ^= 1
	b, err := consensus.AppendFrontier(nil, env, f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestGroupStopCounted: with serve's in-process group, a rank whose peer
// never steps stops the group at the exchange deadline: its step's reply
// says so (item "step", UNAVAILABLE), its session ends as group_stopped,
// and the other rank's as group_ended.
func TestGroupStopCounted(t *testing.T) {
	ctx := context.Background()
	maddr := freePort(t)
	_, sock, _ := startWith(t, Config{DataDir: t.TempDir(), Ranks: 2, Metrics: maddr, GroupTimeout: 300 * time.Millisecond, SessionTTL: time.Minute})
	es := []*testEngine{dialEngine(t, sock, 0, 2), dialEngine(t, sock, 1, 2)}
	for _, e := range es {
		if err := e.register(ctx); err != nil {
			t.Fatal(err)
		}
	}
	before := scrapeMetrics(t, maddr)
	out, err := es[0].run(ctx, &pb.StepRequest{}, nil) // rank 1 never steps
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Errors) != 1 || out.Errors[0].Item != "step" || out.Errors[0].Code != pb.ErrorCode_ERROR_CODE_UNAVAILABLE {
		t.Fatalf("a step whose peer never stepped: %v, want item step, UNAVAILABLE", out.Errors)
	}
	t.Logf("group stop: %s", out.Errors[0].Message)
	if msg := out.Errors[0].Message; !strings.Contains(msg, "ranks [1] did not step within 300ms") {
		t.Fatalf("the group stop %q does not name the rank that did not step", msg)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		after := scrapeMetrics(t, maddr)
		stopped := after.value("kvtier_session_ends_total", map[string]string{"rank": "0", "why": "group_stopped"}) - before.value("kvtier_session_ends_total", map[string]string{"rank": "0", "why": "group_stopped"})
		ended := after.value("kvtier_session_ends_total", map[string]string{"rank": "1", "why": "group_ended"}) - before.value("kvtier_session_ends_total", map[string]string{"rank": "1", "why": "group_ended"})
		if stopped == 1 && ended == 1 {
			break
		}
		if time.Now().After(deadline) || stopped > 1 || ended > 1 {
			t.Fatalf("session ends: group_stopped on rank 0 +%v, group_ended on rank 1 +%v; want +1 each", stopped, ended)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

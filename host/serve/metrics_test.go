package serve

import (
	"context"
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

package serve

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/host/replay"
	"github.com/kvtier/kvtier/loadgen"
	"github.com/kvtier/kvtier/workload"
)

// TestShadowEqualsRecordedReplay runs serve with three shadow policies and
// a recording, drives it with loadgen, and checks for each policy (the
// live one included) at each tier's capacity that the shadow's hit rate
// equals the offline replay of the recording to 1e-9, and that /metrics
// says the same.
func TestShadowEqualsRecordedReplay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	path := filepath.Join(t.TempDir(), "live.jsonl")
	s, sock, stop := startWith(t, Config{DataDir: t.TempDir(), Record: path, Shadow: []string{"slru", "s3fifo", "lru"}})
	if s.shadow == nil {
		t.Fatal("no shadows running")
	}
	g := workload.DefaultGeneratorConfig()
	g.Requests = 400
	reqs, err := workload.Generate(g)
	if err != nil {
		t.Fatal(err)
	}
	res, err := loadgen.Run(ctx, loadgen.Config{Socket: sock, Ranks: 1, Requests: reqs, MaxPages: 48, NoPayload: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 0 {
		t.Fatalf("loadgen: %d errors (%s)", res.Errors, res.FirstError)
	}
	for !s.shadow.Idle() {
		time.Sleep(10 * time.Millisecond)
	}
	// The scrape, while serve still runs.
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	scraped := map[string]float64{}
	var lookups float64
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			switch mf.GetName() {
			case "kvtier_shadow_hit_tokens_total":
				scraped[label(m, "policy")+"/"+label(m, "tier")] = m.GetCounter().GetValue()
			case "kvtier_shadow_lookup_tokens_total":
				lookups = m.GetCounter().GetValue()
			}
		}
	}
	stop()
	s.shadow.Close()
	if d := s.shadow.q.Dropped(); d != 0 {
		t.Fatalf("%d lookups dropped", d)
	}
	got, err := workload.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(reqs) {
		t.Fatalf("recorded %d lookups, loadgen sent %d", len(got), len(reqs))
	}
	tr, err := replay.Compile(path, got)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := builtin.Policies()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"adaptive", "slru", "s3fifo", "lru"}; fmt.Sprint(s.shadow.policies) != fmt.Sprint(want) {
		t.Fatalf("policies %v, want %v (the live one first)", s.shadow.policies, want)
	}
	if len(s.shadow.tiers) < 2 {
		t.Fatalf("tiers %v, want at least l1 and l2", s.shadow.tiers)
	}
	for _, pol := range s.shadow.policies {
		for _, tier := range s.shadow.tiers {
			t.Run(pol+"/"+tier.name, func(t *testing.T) {
				sh, ok := s.shadow.Result(pol, tier.name)
				if !ok {
					t.Fatal("no result")
				}
				ev, err := replay.NewEvictor(reg, tr, replay.Spec{Name: pol})
				if err != nil {
					t.Fatal(err)
				}
				off, err := replay.Run(tr, ev, tier.pages*replay.BlockTokens, nil)
				if err != nil {
					t.Fatal(err)
				}
				if math.Abs(sh.HitRate-off.HitRate) > 1e-9 || sh.Requests != off.Requests {
					t.Fatalf("shadow hit rate %.12f over %d requests, replay of the recording %.12f over %d", sh.HitRate, sh.Requests, off.HitRate, off.Requests)
				}
				if m := scraped[pol+"/"+tier.name] / lookups; math.Abs(m-off.HitRate) > 1e-9 {
					t.Fatalf("/metrics hit rate %.12f, replay %.12f", m, off.HitRate)
				}
				t.Logf("%s at %s (%d pages): %.4f", pol, tier.name, tier.pages, off.HitRate)
			})
		}
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

package serve

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	pb "github.com/kvtier/kvtier/api/enginev1"
)

// dashboardPath is the Grafana dashboard over serve's metrics.
const dashboardPath = "../../deploy/grafana/kvtier-serve.json"

// exprs returns every PromQL query of a dashboard: targets' expr and
// templating queries.
func exprs(v any, out []string) []string {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && (k == "expr" || (k == "query" && strings.Contains(s, "("))) {
				out = append(out, s)
				continue
			}
			out = exprs(x, out)
		}
	case []any:
		for _, x := range v {
			out = exprs(x, out)
		}
	}
	return out
}

var (
	reSelector = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}`)
	reName     = regexp.MustCompile(`\b(?:kvtier|process|go)_[a-zA-Z0-9_]+\b`)
	reMatcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	reBy       = regexp.MustCompile(`\bby\s*\(([^)]*)\)`)
)

// TestGrafanaDashboard: every query of deploy/grafana/kvtier-serve.json
// names only metrics a live serve exports (histograms by their _bucket,
// _sum and _count series), filters and groups only by labels those
// metrics carry (instance and job are Prometheus's), and every panel has
// a query.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	for i, p := range dash["panels"].([]any) {
		if len(exprs(p, nil)) == 0 {
			t.Errorf("panel %d (%v) has no query", i, p.(map[string]any)["title"])
		}
	}

	// A live serve of two ranks (one Machine: the barrier's histogram),
	// with sessions that stepped, so every family shows.
	ctx := context.Background()
	maddr := freePort(t)
	s, sock, _ := startWith(t, Config{DataDir: t.TempDir(), Ranks: 2, Metrics: maddr, Shadow: []string{"lru"}, Doors: []string{DoorEngine, DoorStore}})
	es := openGroup(t, ctx, s, sock, 2)
	driveGroup(t, ctx, es, "dash", chain("dash", 4, 4, ""))
	stepAll(t, ctx, es, func() *pb.StepRequest { return &pb.StepRequest{Finished: []*pb.Finish{{ReqId: "none"}}} }, nil)
	fams := scrapeMetrics(t, maddr)
	labels := map[string]map[string]bool{} // series name -> its labels
	for name, f := range fams {
		ls := map[string]bool{"instance": true, "job": true}
		for _, m := range f.Metric {
			for _, l := range m.Label {
				ls[l.GetName()] = true
			}
		}
		labels[name] = ls
		if f.GetType() == dto.MetricType_HISTOGRAM {
			lb := map[string]bool{"le": true}
			for k := range ls {
				lb[k] = true
			}
			labels[name+"_bucket"], labels[name+"_sum"], labels[name+"_count"] = lb, ls, ls
		}
	}

	qs := exprs(dash, nil)
	if len(qs) < 10 {
		t.Fatalf("%d queries in the dashboard", len(qs))
	}
	used := map[string]bool{}
	for _, q := range qs {
		names := reName.FindAllString(q, -1)
		for _, m := range reSelector.FindAllStringSubmatch(q, -1) {
			names = append(names, m[1])
			ls := labels[m[1]]
			for _, mm := range reMatcher.FindAllStringSubmatch(m[2], -1) {
				if ls != nil && !ls[mm[1]] {
					t.Errorf("query %q: %s has no label %q", q, m[1], mm[1])
				}
			}
		}
		if len(names) == 0 {
			t.Errorf("query %q names no metric", q)
		}
		for _, n := range names {
			if labels[n] == nil {
				t.Errorf("query %q: serve exports no metric %s", q, n)
			}
			used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")] = true
		}
		for _, by := range reBy.FindAllStringSubmatch(q, -1) {
			for _, l := range strings.Split(by[1], ",") {
				l = strings.TrimSpace(l)
				ok := false
				for _, n := range names {
					ok = ok || labels[n][l]
				}
				if !ok {
					t.Errorf("query %q groups by %q, which none of %v carries", q, l, names)
				}
			}
		}
	}
	// Every kvtier metric serve exports is on the dashboard.
	for name := range fams {
		if strings.HasPrefix(name, "kvtier_") && !used[name] {
			t.Errorf("serve exports %s and no panel shows it", name)
		}
	}
}

package datareplay

import (
	"context"
	"strings"
	"testing"
)

// TestDataSteps replays one generated trace at 1, 8 and 32 new requests a
// step: every step ticks twice (the load-backs, then the prefills), the
// steps follow the requests a step, no byte is wrong, every hit is a page
// the engine read and verified, and the hit rate stays within a few
// points of one request a step (what a step loses: a prefix two requests
// of one step share misses for both, a reload lands a step later).
//
// On the built-in stack (L1 256 pages, about 7 pages a request here) a
// step of 32 does not fit in L1 with the requests waiting on their L3
// lookup, so steps admit fewer (up to twice the steps); with an L1 of 1024
// pages a step takes its 32.
func TestDataSteps(t *testing.T) {
	tr := generatedSeeded(t, 1, 1000)
	n := tr.Requests()
	cases := []struct {
		name    string
		l1Pages string
		step    int
		// l1Binds: L1 holds less than a step, which may then take up to
		// twice the steps.
		l1Binds bool
	}{
		{"step-1", "256", 1, false},
		{"step-8", "256", 8, false},
		{"step-32", "256", 32, true},
		{"step-32-l1-1024", "1024", 32, false},
	}
	var ref float64
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			yaml := strings.Replace(dataYAML, "config: {pages: 256,", "config: {pages: "+c.l1Pages+",", 1)
			res, err := RunData(context.Background(), tr, DataConfig{Dir: t.TempDir(), YAML: yaml, StepRequests: c.step})
			if err != nil {
				t.Fatal(err)
			}
			hits := res.HitPagesByTier["l1"] + res.HitPagesByTier["l2"] + res.HitPagesByTier["l3"]
			t.Logf("L1 %s pages, %d a step: %d steps, %d ticks, hit rate %.4f by tier %v, verified %d, skips %v",
				c.l1Pages, c.step, res.Steps, res.Ticks, res.HitRate, res.HitPagesByTier, res.VerifiedPages, res.Skips)
			if !strings.Contains(res.Geometry, "L1 l1 "+c.l1Pages+" pages") {
				t.Fatalf("geometry %q: the L1 is not %s pages", res.Geometry, c.l1Pages)
			}
			if res.WrongBytes != 0 {
				t.Fatalf("%d wrong bytes", res.WrongBytes)
			}
			if res.Requests != n {
				t.Fatalf("%d requests replayed, want %d", res.Requests, n)
			}
			if hits == 0 || hits > res.VerifiedPages {
				t.Fatalf("%d hit pages, %d verified: every hit must be a verified page", hits, res.VerifiedPages)
			}
			if res.HitPagesByTier["l1"] == 0 || res.HitPagesByTier["l2"] == 0 {
				t.Fatalf("hits by tier %v: want L1 and L2 hits", res.HitPagesByTier)
			}
			// NB: the end of the run may tick to let the last spills land.
			if res.Ticks < 2*res.Steps || res.Ticks > 2*res.Steps+64 {
				t.Fatalf("%d ticks for %d steps: want two a step (and at most 64 to land the spills)", res.Ticks, res.Steps)
			}
			// The last requests held over a step add a few.
			ideal := (n + c.step - 1) / c.step
			most := ideal + 8
			if c.l1Binds {
				most += ideal
			}
			if res.Steps < uint64(ideal) || res.Steps > uint64(most) {
				t.Fatalf("%d steps for %d requests at %d a step: want %d to %d", res.Steps, n, c.step, ideal, most)
			}
			if res.Skips["capacity"] != 0 {
				t.Fatalf("skips %v: a step admits only what L1 holds, and 64 reloads cover two steps", res.Skips)
			}
			if i == 0 {
				ref = res.HitRate
			} else if res.HitRate < ref-0.04 {
				t.Fatalf("hit rate %.4f, more than 4 points below %.4f at one request a step", res.HitRate, ref)
			}
		})
	}
}

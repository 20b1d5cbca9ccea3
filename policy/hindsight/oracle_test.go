package hindsight

import (
	"math"
	"math/bits"
	"slices"
	"testing"

	"github.com/kvtier/kvtier/host/replay"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/policytest"
	"github.com/kvtier/kvtier/workload"
)

// TestOracleHeadroom measures, on the shared trace at 3M tokens, how far
// hindsight's structure would go with knowledge no replicated signal
// carries, read from the trace's future: at each hit, whether the matched
// node is used again (ever, or within 2,000 ticks), and at each insert,
// whether the request's first new page is ever asked for again (fed to
// the policy in place of the output length). These are the oracle figures
// of docs/policies.md ("Target status"); the test logs them and checks
// that knowledge only helps.
func TestOracleHeadroom(t *testing.T) {
	reqs := policytest.SharedTrace(t, "mooncake_synthetic_trace.jsonl")
	tr, err := replay.Compile("mooncake", reqs)
	if err != nil {
		t.Fatal(err)
	}
	// The insert-time oracle: output 1 when the first page the request
	// adds is asked for by a later request, 1000 when never.
	insertOracle := slices.Clone(reqs)
	last, seenBefore := blockUses(reqs)
	for i := range insertOracle {
		h, m := insertOracle[i].HashIDs, seenBefore[i]
		insertOracle[i].OutputLength = 1000
		if m < len(h) && last[h[m]] > i {
			insertOracle[i].OutputLength = 1
		}
	}
	trInsert, err := replay.Compile("mooncake-insert-oracle", insertOracle)
	if err != nil {
		t.Fatal(err)
	}
	dead := func(tr *replay.Trace, horizon uint64) func(policy.NodeInfo) bool {
		return func(n policy.NodeInfo) bool {
			at, ok := tr.NextUse(n.Tail, n.Time)
			return !ok || at-n.Time > horizon
		}
	}
	const ever = ^uint64(0)
	run := func(tr *replay.Trace, horizon uint64, toLow bool) float64 {
		t.Helper()
		h, err := New(policy.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if horizon != 0 {
			h.deadAtHit, h.deadToLow = dead(tr, horizon), toLow
		}
		r, err := replay.Run(tr, h, 3_000_000, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r.HitRate
	}
	shipped := run(tr, 0, false)
	cases := []struct {
		name    string
		tr      *replay.Trace
		horizon uint64
		toLow   bool
	}{
		{"hit oracle (used again ever), protection withheld", tr, ever, false},
		{"hit oracle (used again ever), dead to the low class", tr, ever, true},
		{"hit oracle (used again within 2,000 ticks), protection withheld", tr, 2000, false},
		{"hit oracle (used again within 2,000 ticks), dead to the low class", tr, 2000, true},
		{"insert oracle only", trInsert, 0, false},
		{"insert oracle + hit oracle (ever), dead to the low class", trInsert, ever, true},
		{"insert oracle + hit oracle (2,000 ticks), dead to the low class", trInsert, 2000, true},
	}
	t.Logf("hindsight as shipped: %.2f%%", 100*shipped)
	for _, c := range cases {
		got := run(c.tr, c.horizon, c.toLow)
		t.Logf("%s: %.2f%% (%+.2f)", c.name, 100*got, 100*(got-shipped))
		if got < shipped {
			t.Errorf("%s: %.2f%% is below the policy without it (%.2f%%)", c.name, 100*got, 100*shipped)
		}
	}
}

// TestTraceReuseStructure measures the facts about the shared trace that
// docs/policies.md ("Target status") rests on, and checks them: the output
// length of the request that inserts a document separates reused documents
// from one-off ones; once a document is reused, whether a use is its last
// does not depend on how many uses it had or how long ago the previous one
// was; and the gap to the next use barely follows the previous gap. A
// document is a trace's first hash id (the ids are prefix-chained).
func TestTraceReuseStructure(t *testing.T) {
	reqs := policytest.SharedTrace(t, "mooncake_synthetic_trace.jsonl")

	// New blocks by the request that inserted them, and later reuse.
	last, seenBefore := blockUses(reqs)
	type tally struct{ n, hit int }
	outClass := func(out int) string {
		switch {
		case out < 32:
			return "output < 32"
		case out < 128:
			return "output 32-127"
		}
		return "output >= 128"
	}
	newBlocks := map[string]*tally{}
	for i, r := range reqs {
		h, m := r.HashIDs, seenBefore[i]
		kind := "continuation"
		if m == 0 {
			kind = "new document, " + outClass(r.OutputLength)
		}
		if newBlocks[kind] == nil {
			newBlocks[kind] = &tally{}
		}
		for _, id := range h[m:] {
			newBlocks[kind].n++
			if last[id] > i {
				newBlocks[kind].hit++
			}
		}
	}
	rate := func(x *tally) float64 { return float64(x.hit) / float64(max(x.n, 1)) }
	for _, k := range []string{"new document, output < 32", "new document, output 32-127", "new document, output >= 128", "continuation"} {
		t.Logf("new blocks inserted by a %s request: %d, reused later %.0f%%", k, newBlocks[k].n, 100*rate(newBlocks[k]))
	}
	if r := rate(newBlocks["new document, output < 32"]); r < 0.75 {
		t.Errorf("documents inserted by short-answer requests reused %.2f of the time, the docs say >= 0.75", r)
	}
	if r := rate(newBlocks["new document, output >= 128"]); r > 0.10 {
		t.Errorf("documents inserted by long-answer requests reused %.2f of the time, the docs say <= 0.10", r)
	}

	// Uses of each reused document: is a use the last one?
	uses := map[uint64][]int{}
	var docs []uint64
	for i, r := range reqs {
		d := r.HashIDs[0]
		if uses[d] == nil {
			docs = append(docs, d)
		}
		uses[d] = append(uses[d], i)
	}
	byUse := map[int]*tally{}
	byGap := map[int]*tally{}
	var xs, ys []float64
	for _, d := range docs {
		u := uses[d]
		for k := 1; k < len(u); k++ {
			isLast := k == len(u)-1
			o := min(k+1, 8) // the (k+1)-th use; 8 = 8th or later
			g := bits.Len(uint(u[k] - u[k-1]))
			if byUse[o] == nil {
				byUse[o] = &tally{}
			}
			if byGap[g] == nil {
				byGap[g] = &tally{}
			}
			byUse[o].n++
			byGap[g].n++
			if isLast {
				byUse[o].hit++
				byGap[g].hit++
			}
			if k >= 3 {
				xs = append(xs, math.Log2(float64(u[k-1]-u[k-2]+1)))
				ys = append(ys, math.Log2(float64(u[k]-u[k-1]+1)))
			}
		}
	}
	for o := 2; o <= 8; o++ {
		r := rate(byUse[o])
		t.Logf("use %d%s of a document: %d, the last one %.0f%%", o, map[bool]string{true: "+", false: ""}[o == 8], byUse[o].n, 100*r)
		if r < 0.10 || r > 0.45 {
			t.Errorf("use %d: the last one %.2f of the time, the docs say 0.10-0.45 for every count", o, r)
		}
	}
	for g := 0; g <= 16; g++ {
		x := byGap[g]
		if x == nil || x.n < 40 {
			continue
		}
		r := rate(x)
		t.Logf("uses %d-%d requests after the previous one: %d, the last one %.0f%%", 1<<(g-1), 1<<g-1, x.n, 100*r)
		if r < 0.10 || r > 0.45 {
			t.Errorf("gap bucket %d: the last use %.2f of the time, the docs say 0.10-0.45 for every gap", g, r)
		}
	}
	c := correlation(xs, ys)
	t.Logf("correlation of log2 consecutive gaps (first gap excluded): %.2f over %d pairs", c, len(xs))
	if c > 0.35 || c < -0.35 {
		t.Errorf("consecutive gaps correlate %.2f, the docs say |r| < 0.35", c)
	}
}

// blockUses returns, per trace block id, the last request that asks for
// it, and per request how many of its leading blocks an earlier request
// asked for (the prefix an infinite cache would match; the rest is new).
func blockUses(reqs []workload.Request) (last map[uint64]int, seenBefore []int) {
	last = map[uint64]int{}
	seenBefore = make([]int, len(reqs))
	seen := map[uint64]bool{}
	for i, r := range reqs {
		h := r.HashIDs
		for seenBefore[i] < len(h) && seen[h[seenBefore[i]]] {
			seenBefore[i]++
		}
		for _, id := range h {
			last[id] = i
			seen[id] = true
		}
	}
	return last, seenBefore
}

// correlation returns Pearson's r of xs and ys.
func correlation(xs, ys []float64) float64 {
	n := float64(len(xs))
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx, my = mx/n, my/n
	var sxy, sxx, syy float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
		syy += (ys[i] - my) * (ys[i] - my)
	}
	return sxy / math.Sqrt(sxx*syy)
}

package control

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/pagehash"
)

type pagehashT = pagehash.Hash

func testMachine(t testing.TB) *Machine {
	t.Helper()
	o := DefaultOptions()
	o.L1Pages, o.L2 = 16, SimpleLayout(16, 4096)
	o.Logger = slog.New(slog.DiscardHandler)
	m, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func mustApply(t testing.TB, m *Machine, lines ...string) {
	t.Helper()
	for _, l := range lines {
		e, err := ParseEvent(l)
		if err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		if err := m.Apply(e); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
	}
}

// TestContractErrors: every event that breaks the engine contract is an
// *EventError naming the request and the op, wrapping the sentinel callers
// branch on, and leaves the digest unchanged.
func TestContractErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup []string
		event Event
		want  error
		names []string
	}{
		{"insert pages != hashes", nil, Event{Kind: EvInsert, Req: 3, Pages: 2, Hashes: []pagehashT{PageHash("a")}}, ErrContract, []string{"insert req 3", "2 pages but 1 hashes"}},
		{"match pages != hashes", nil, Event{Kind: EvMatch, Req: 4, Pages: 0, Hashes: []pagehashT{PageHash("a")}}, ErrContract, []string{"match req 4"}},
		{"extend pages != hashes", []string{"insert req=1 hashes=a"}, Event{Kind: EvExtend, Req: 1, Node: 1, Pages: 3, Hashes: []pagehashT{PageHash("b")}}, ErrContract, []string{"extend req 1 node 1"}},
		{"extend of unknown node", nil, Event{Kind: EvExtend, Req: 5, Node: 77, Pages: 1, Hashes: []pagehashT{PageHash("b")}}, ErrContract, []string{"extend req 5 node 77", "unknown node 77"}},
		{"release without lock", nil, Event{Kind: EvRelease, Req: 6}, ErrContract, []string{"release req 6", "without a lock"}},
		{"release twice", []string{"insert req=6 hashes=a", "release req=6"}, Event{Kind: EvRelease, Req: 6}, ErrContract, []string{"release req 6"}},
		{"finish of unknown request", nil, Event{Kind: EvFinish, Req: 8}, ErrContract, []string{"finish req 8"}},
		{"completion of unknown op", nil, Event{Kind: EvDone, Op: 9, Stage: StageCopied, OK: true}, ErrUnknownOp, []string{"done op 9"}},
		{"completion in a wrong stage", []string{"insert req=1 hashes=a"}, Event{Kind: EvDone, Op: 1, Stage: StageDurable}, ErrStage, []string{"done op 1", "durable"}},
		{"longest of a copy op", []string{"insert req=1 hashes=a", "done op=1 stage=copied ok"}, Event{Kind: EvLongest, Op: 1, Pages: 1}, ErrStage, []string{"longest op 1"}},
		{"empty insert", nil, Event{Kind: EvInsert, Req: 2}, ErrContract, []string{"insert req 2", "no pages"}},
		{"held request matches", []string{"match req=2 hashes=q"}, Event{Kind: EvMatch, Req: 2, Pages: 1, Hashes: []pagehashT{PageHash("q")}}, ErrContract, []string{"match req 2", "held"}},
		{"bad tier", nil, Event{Kind: EvTier, Tier: 0}, ErrContract, []string{"tier"}},
		{"unknown kind", nil, Event{Kind: 99}, ErrContract, []string{"unknown event kind"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := testMachine(t)
			mustApply(t, m, tc.setup...)
			before := m.Digest()
			err := m.Apply(tc.event)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			var ee *EventError
			if !errors.As(err, &ee) {
				t.Fatalf("%v is not an *EventError", err)
			}
			for _, n := range tc.names {
				if !strings.Contains(err.Error(), n) {
					t.Errorf("error %q does not name %q", err, n)
				}
			}
			if m.Digest() != before {
				t.Fatalf("refused event changed the digest")
			}
		})
	}
}

// TestDurableBeforeGathered: a spill's durable stage cannot be reported
// before its gathered stage, and the refusal changes nothing.
func TestDurableBeforeGathered(t *testing.T) {
	m := testMachine(t)
	mustApply(t, m, "insert req=1 hashes=a,b", "done op=1 stage=copied ok")
	f, _ := Reduce(m.Contribution())
	if err := m.Tick(f); err != nil {
		t.Fatal(err)
	}
	c := m.Contribution()
	if err := m.Done(2, StageDurable, true); !errors.Is(err, ErrStage) {
		t.Fatalf("durable before gathered: %v", err)
	}
	if got := m.Contribution(); got.Pipelines[PipelineDurable].Done != c.Pipelines[PipelineDurable].Done {
		t.Fatal("refused done changed the contribution")
	}
}

// TestBadFrontier: a frontier that does not fit is refused and changes
// nothing.
func TestBadFrontier(t *testing.T) {
	m := testMachine(t)
	mustApply(t, m, "insert req=1 hashes=a,b", "done op=1 stage=copied ok")
	good, _ := Reduce(m.Contribution())
	before := m.Digest()
	for name, mut := range map[string]func(*Frontier){
		"tick": func(f *Frontier) { f.Tick++ },
		"base": func(f *Frontier) { f.Pipelines[PipelineBackup].Base++ },
		"beyond issued": func(f *Frontier) {
			f.Pipelines[PipelineBackup].Done++
			f.Pipelines[PipelineBackup].OK = append(f.Pipelines[PipelineBackup].OK, true)
		},
		"ok bits": func(f *Frontier) { f.Pipelines[PipelineBackup].OK = nil },
		"durable ahead": func(f *Frontier) {
			f.Pipelines[PipelineDurable].Done = 1
			f.Pipelines[PipelineDurable].OK = []bool{true}
		},
	} {
		f := good
		f.Pipelines = good.Pipelines
		f.Pipelines[PipelineBackup].OK = append([]bool(nil), good.Pipelines[PipelineBackup].OK...)
		mut(&f)
		if err := m.Tick(f); !errors.Is(err, ErrFrontier) {
			t.Errorf("%s: got %v, want ErrFrontier", name, err)
		}
		if m.Digest() != before {
			t.Fatalf("%s: refused frontier changed the digest", name)
		}
	}
	if err := m.Tick(good); err != nil {
		t.Fatal(err)
	}
}

// TestDigestSeesDivergence: one event applied on one replica only changes
// its digest (the digest is worth comparing).
func TestDigestSeesDivergence(t *testing.T) {
	a, b := testMachine(t), testMachine(t)
	mustApply(t, a, "insert req=1 hashes=a,b")
	mustApply(t, b, "insert req=1 hashes=a,b")
	if a.Digest() != b.Digest() {
		t.Fatal("equal histories, different digests")
	}
	mustApply(t, b, "match req=2 hashes=a")
	if a.Digest() == b.Digest() {
		t.Fatal("a match on one replica did not change its digest")
	}
}

// TestReduceMinAnd: the frontier is the MIN of done counts and values and
// the AND of ok and tier bits.
func TestReduceMinAnd(t *testing.T) {
	mk := func(done uint64, ok []bool, vals []int, up uint8) Contribution {
		var c Contribution
		c.TierUp = up
		c.Pipelines[PipelineLookup] = PipelineProgress{Base: 0, Done: done, OK: ok, Values: vals}
		return c
	}
	f, err := Reduce(
		mk(3, []bool{true, true, true}, []int{4, 2, 5}, 0xff),
		mk(2, []bool{true, false}, []int{3, 7}, 0xfb),
	)
	if err != nil {
		t.Fatal(err)
	}
	p := f.Pipelines[PipelineLookup]
	if p.Done != 2 || p.OK[0] != true || p.OK[1] != false || p.Values[0] != 3 || p.Values[1] != 2 || f.TierUp != 0xfb {
		t.Fatalf("reduce: %s", f)
	}
	if _, err := Reduce(mk(1, []bool{true}, []int{1}, 0), Contribution{Tick: 1}); !errors.Is(err, ErrFrontier) {
		t.Fatalf("different ticks: %v", err)
	}
}

// TestSkipLoggedOncePerInterval: a skip is counted every time and logged
// at most once per interval per reason and place; the next line carries
// the number held back.
func TestSkipLoggedOncePerInterval(t *testing.T) {
	var buf strings.Builder
	now := time.Unix(0, 0)
	o := DefaultOptions()
	o.L1Pages, o.L2 = 4, SimpleLayout(4, 4096)
	o.Logger = slog.New(slog.NewTextHandler(&buf, nil))
	o.LogInterval = time.Second
	o.LogClock = func() time.Time { return now }
	m, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		mustApply(t, m, fmt.Sprintf("insert req=%d hashes=x%d,y%d,z%d,w%d,v%d", i+1, i, i, i, i, i))
	}
	if got := m.Count("capacity at l1 admit"); got != 3 {
		t.Fatalf("counted %d skips, want 3", got)
	}
	if n := strings.Count(buf.String(), "skipped"); n != 1 {
		t.Fatalf("logged %d lines within one interval, want 1:\n%s", n, buf.String())
	}
	now = now.Add(2 * time.Second)
	mustApply(t, m, "insert req=9 hashes=q1,q2,q3,q4,q5")
	if !strings.Contains(buf.String(), "suppressed=2") {
		t.Fatalf("the line after the interval does not count the 2 held back:\n%s", buf.String())
	}
}

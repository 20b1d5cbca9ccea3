package serve

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/pagehash"
)

// TestOversizeStep: a Step larger than MaxMessageBytes is refused with
// ResourceExhausted before serve decodes it, and serve goes on serving
// the same session.
func TestOversizeStep(t *testing.T) {
	ctx := context.Background()
	const max = 5 << 20
	_, sock, _ := startWith(t, Config{DataDir: t.TempDir(), MaxMessageBytes: max})
	e := dialEngine(t, sock, 0, 1)
	if err := e.register(ctx); err != nil {
		t.Fatal(err)
	}
	key := chain("big", 4, 4, "")
	drive(t, ctx, e, "before", key)
	for _, size := range []int{max + 1, 250 << 20} {
		// Lookups of 2048 pages (64 KiB of hashes each) up to size.
		var q pb.StepRequest
		for n := 0; n*(2048*pagehash.Size) <= size; n++ {
			q.Lookups = append(q.Lookups, &pb.Lookup{ReqId: "l" + strconv.Itoa(n), Pages: 2048, Hashes: make([]byte, 2048*pagehash.Size)})
		}
		_, err := e.run(ctx, &q, nil)
		if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted {
			t.Fatalf("a step of %d bytes: %v, want ResourceExhausted", size, err)
		}
	}
	// The refused steps never arrived: the next step number may be any
	// larger one, and the session serves on.
	res := drive(t, ctx, e, "after", key)
	if res.HitPages != 4 || e.wrong != 0 {
		t.Fatalf("after the oversize steps: hit %d pages, want 4; %d wrong", res.HitPages, e.wrong)
	}
	if _, err := Open(ctx, Config{DataDir: t.TempDir(), Socket: "x", MaxMessageBytes: 1 << 20}); err == nil || !strings.Contains(err.Error(), "max message bytes") {
		t.Fatalf("a max message size below one largest request: %v", err)
	}
}

// TestPlanDeadline: a plan the engine does not report within PlanTimeout
// is failed: the next reply names it (item "plan:N", UNAVAILABLE), the
// Machine rolls it back (its L1 pages are no longer pinned), a late
// report of it is UNKNOWN, and plans reported in time are never failed.
func TestPlanDeadline(t *testing.T) {
	ctx := context.Background()
	// A deadline of 1 ns: every plan not reported in the very next step
	// is overdue (the check runs after the step's completions).
	s, sock, _ := startWith(t, Config{DataDir: t.TempDir(), PlanTimeout: time.Nanosecond})
	e := dialEngine(t, sock, 0, 1)
	if err := e.register(ctx); err != nil {
		t.Fatal(err)
	}
	key := chain("pd", 6, 6, "")
	drive(t, ctx, e, "warm", key) // plans reported in time
	if n := s.ranks[0].stats.overduePlans.Load(); n != 0 {
		t.Fatalf("%d plans failed that were reported in the next step", n)
	}
	nk := chain("pd-new", 6, 6, "")
	keys := map[string][]pagehash.Hash{"x": nk}
	// A miss is PENDING while serve asks the L3: step until DONE.
	lookupGroup(t, ctx, []*testEngine{e}, "x", nk)
	out, err := e.run(ctx, &pb.StepRequest{Stores: []*pb.Store{{ReqId: "x", Pages: 6, Hashes: packHashes(nk)}}}, keys)
	if err != nil || len(out.Plans) == 0 {
		t.Fatalf("no plan owed: %v %v", err, out)
	}
	owed := e.done
	e.done = nil // the engine never reports them
	out, err = e.run(ctx, &pb.StepRequest{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	failed := map[string]bool{}
	for _, ie := range out.Errors {
		if ie.Code != pb.ErrorCode_ERROR_CODE_UNAVAILABLE || !strings.HasPrefix(ie.Item, "plan:") {
			t.Fatalf("unexpected error %v", ie)
		}
		failed[ie.Item] = true
	}
	for _, c := range owed {
		if !failed[fmt.Sprintf("plan:%d", c.Plan)] {
			t.Fatalf("plan %d overdue and not named in the reply: %v", c.Plan, out.Errors)
		}
	}
	if n := s.ranks[0].stats.overduePlans.Load(); n != int64(len(owed)) {
		t.Fatalf("%d plans counted overdue, %d owed", n, len(owed))
	}
	// A late report is UNKNOWN.
	out, err = e.run(ctx, &pb.StepRequest{Completions: owed}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Errors) != len(owed) || out.Errors[0].Code != pb.ErrorCode_ERROR_CODE_UNKNOWN {
		t.Fatalf("a late report: %v, want UNKNOWN per plan", out.Errors)
	}
	// Rolled back: nothing is in flight, the rank serves on, and every
	// byte it hands out is right.
	// (The snapshot the rank published after that step: the Node is
	// its goroutine's.)
	if n := s.ranks[0].snap.Load().poolInflight; n != 0 {
		t.Fatalf("%d pool batches still in flight after the deadline", n)
	}
	e.run(ctx, &pb.StepRequest{Finished: []*pb.Finish{{ReqId: "x"}}}, nil)
	drive(t, ctx, e, "after1", nk)
	res := drive(t, ctx, e, "after2", nk)
	if res.HitPages != 6 || e.wrong != 0 {
		t.Fatalf("after the deadline: hit %d pages, want 6; %d wrong", res.HitPages, e.wrong)
	}
}

// keyCheck is a slog handler that records every line whose keys repeat
// (the attributes of With and of the record together).
type keyCheck struct {
	mu    *sync.Mutex
	bad   *[]string
	lines *int
	attrs []slog.Attr
}

func (h keyCheck) Enabled(context.Context, slog.Level) bool { return true }

func (h keyCheck) Handle(_ context.Context, r slog.Record) error {
	seen := map[string]bool{}
	var dup []string
	add := func(a slog.Attr) {
		if seen[a.Key] {
			dup = append(dup, a.Key)
		}
		seen[a.Key] = true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(func(a slog.Attr) bool { add(a); return true })
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.lines++
	if len(dup) > 0 {
		var b strings.Builder
		b.WriteString(r.Message)
		for _, a := range h.attrs {
			b.WriteString(" " + a.String())
		}
		r.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
		*h.bad = append(*h.bad, fmt.Sprintf("%v repeated: %s", dup, b.String()))
	}
	return nil
}

func (h keyCheck) WithAttrs(as []slog.Attr) slog.Handler {
	h.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return h
}

func (h keyCheck) WithGroup(string) slog.Handler { return h }

// TestLogKeysOnce runs serves of two ranks (private stacks, and a shared
// stack with owner lanes) through sessions that start and end, and
// checks that no log line carries a key twice.
func TestLogKeysOnce(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lanes bool
	}{{"private", false}, {"owner lanes", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			var mu sync.Mutex
			var bad []string
			lines := 0
			log := slog.New(keyCheck{mu: &mu, bad: &bad, lines: &lines})
			_, sock, stop := startWith(t, Config{DataDir: t.TempDir(), Ranks: 2, OwnerLanes: tc.lanes, Logger: log, SessionTTL: time.Minute})
			es := []*testEngine{dialEngine(t, sock, 0, 2), dialEngine(t, sock, 1, 2)}
			for round := range 2 {
				for _, e := range es {
					if err := e.register(ctx); err != nil {
						t.Fatal(err)
					}
				}
				driveGroup(t, ctx, es, fmt.Sprintf("k%d", round), chain("logs", 4, 4, ""))
			}
			stop()
			mu.Lock()
			defer mu.Unlock()
			if lines < 5 {
				t.Fatalf("only %d log lines", lines)
			}
			for _, b := range bad {
				t.Error(b)
			}
		})
	}
}

// TestDefaultL3PerRank: with the embedded default stack every rank's L3
// holds the budget docs/serve.md states (256 MiB of its own disk), not a
// share of it.
func TestDefaultL3PerRank(t *testing.T) {
	s, _, _ := startServer(t, t.TempDir(), 2)
	for _, r := range s.ranks {
		// The slots' headers and alignment take a share of the budget
		// (16 KiB pages: about a fifth); a budget split between the two
		// ranks would leave at most 128 MiB.
		c := r.st.Stores[0].Store.Stats().CapacityBytes
		if c < 192<<20 || c > 256<<20 {
			t.Fatalf("rank %d: L3 capacity %d bytes of pages, want 192..256 MiB of a 256 MiB budget", r.idx, c)
		}
	}
}

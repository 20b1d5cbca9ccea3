package serve

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/pagehash"
)

var sessionEndSizes = flag.String("sessionend.sizes", "2,3,8", "group sizes TestSessionEndMatrix runs (-short: 2 only)")

// How a session ends.
type endWay int

const (
	endClose endWay = iota
	endDrop
	endTTL
	endReRegister
)

func (w endWay) String() string {
	return [...]string{"close", "drop", "ttl", "reregister"}[w]
}

// why is the cause serve names for an end of this kind.
func (w endWay) why() string {
	return [...]string{"closed", "disconnected", "expired", "replaced by a new Register"}[w]
}

// What the other ranks are doing when it ends.
type peerState int

const (
	peerIdle     peerState = iota
	peerLookups            // in a step with lookups, waiting for the victim
	peerStores             // in a step with stores, waiting for the victim
	peerOwing              // idle, owing the completions of plans
	peerExchange           // in an empty step, waiting in the exchange
)

func (p peerState) String() string {
	return [...]string{"idle", "lookups", "stores", "owing", "exchange"}[p]
}

// blocked reports whether the other ranks are inside a Step when the
// victim's session ends.
func (p peerState) blocked() bool { return p == peerLookups || p == peerStores || p == peerExchange }

// TestSessionEndMatrix ends one rank's session in every way a session
// ends while the other ranks are in every state they can be in, against a
// real serve over its unix socket, one serve per group size (the cases run
// one after another on it, so each starts in a later epoch). After every
// end: the other ranks' steps in flight return, naming the rank whose
// session ended and why; their sessions are over; and the next engine's
// ranks step cleanly and get hits whose bytes are verified.
func TestSessionEndMatrix(t *testing.T) {
	sizes := []int{2}
	if !testing.Short() {
		sizes = nil
		for _, f := range strings.Split(*sessionEndSizes, ",") {
			var n int
			if _, err := fmt.Sscan(f, &n); err != nil || n < 2 {
				t.Fatalf("-sessionend.sizes: %q is not a group size of 2 or more", f)
			}
			sizes = append(sizes, n)
		}
	}
	all := []peerState{peerIdle, peerLookups, peerStores, peerOwing, peerExchange}
	type group struct {
		transport string
		n         int
		states    []peerState
	}
	var groups []group
	for _, n := range sizes {
		groups = append(groups, group{GroupInproc, n, all})
	}
	// With the engine as the transport no rank waits inside a Step: a
	// rank's tick waits between its steps for the engine's frontier (the
	// state of every rank after a step), and the "blocked" states are
	// steps the victim never made.
	groups = append(groups, group{GroupEngine, 2, all})
	for _, g := range groups {
		t.Run(fmt.Sprintf("%s/ranks=%d", g.transport, g.n), func(t *testing.T) {
			// A short TTL for the expiry cases; a group timeout well above
			// it, so a rank waiting in the exchange for an expiring peer
			// sees the expiry, not a timeout.
			s, sock, _ := startWith(t, Config{DataDir: t.TempDir(), Ranks: g.n, Group: g.transport, SessionTTL: time.Second, GroupTimeout: 20 * time.Second})
			i := 0
			for _, way := range []endWay{endClose, endDrop, endTTL, endReRegister} {
				for _, st := range g.states {
					victim := (i + g.n - 1) % g.n
					name := fmt.Sprintf("%v/%v/victim=%d", way, st, victim)
					sessionEndCase(t, s, sock, g.n, victim, way, st, fmt.Sprintf("c%d", i), name)
					i++
				}
			}
		})
	}
}

// openGroup dials and registers one engine per rank.
func openGroup(t *testing.T, ctx context.Context, s *Server, sock string, n int) []*testEngine {
	t.Helper()
	es := make([]*testEngine, n)
	for r := range es {
		es[r] = dialEngine(t, sock, uint32(r), uint32(n))
		es[r].engineGroup = s.cfg.Group == GroupEngine
		if err := es[r].register(ctx); err != nil {
			t.Fatalf("rank %d: register: %v", r, err)
		}
	}
	return es
}

func lookupStep(name string, key []pagehash.Hash) func() *pb.StepRequest {
	return func() *pb.StepRequest {
		return &pb.StepRequest{Lookups: []*pb.Lookup{{ReqId: name, Pages: uint32(len(key)), Hashes: packHashes(key)}}}
	}
}

// waitFor polls cond (bounded), failing with what it waited for.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func sessionEndCase(t *testing.T, s *Server, sock string, n, victim int, way endWay, st peerState, tag, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%s: "+format, append([]any{name}, args...)...)
	}
	es := openGroup(t, ctx, s, sock, n)
	defer func() {
		for _, e := range es {
			e.close()
		}
	}()
	// Pages for the next engine to hit: stored (and durable: write
	// through) in this epoch.
	warm := chain(tag+"-prefix", 4, 6, tag+"-warm")
	driveGroup(t, ctx, es, tag+"-warm", warm)
	// Report the store's plans, so its pages reach L2 and L3.
	for range 3 {
		stepAll(t, ctx, es, func() *pb.StepRequest { return &pb.StepRequest{} }, nil)
	}

	// The other ranks' state.
	others := make([]int, 0, n-1)
	for r := range n {
		if r != victim {
			others = append(others, r)
		}
	}
	var q func() *pb.StepRequest
	keys := map[string][]pagehash.Hash{}
	switch st {
	case peerLookups:
		key := chain(tag+"-prefix", 4, 6, tag+"-look")
		q = lookupStep(tag+"-look", key)
	case peerStores, peerOwing:
		key := chain(tag+"-prefix", 4, 8, tag+"-store")
		keys[tag+"-store"] = key
		// NB: the lookup asks the L3 on the store worker, so it is
		// PENDING first and a later reply (not every one) carries DONE.
		done := func(out *pb.StepReply) bool {
			for _, l := range out.Lookups {
				if l.ReqId == tag+"-store" && l.Status == pb.LookupStatus_LOOKUP_STATUS_DONE {
					return true
				}
			}
			return false
		}
		outs := stepAll(t, ctx, es, lookupStep(tag+"-store", key), keys)
		for n := 0; !done(outs[0]); n++ {
			if n > 200 {
				fail("lookup before the stores still pending")
			}
			time.Sleep(time.Millisecond) // pace like an engine: the reload TTL counts ticks
			outs = stepAll(t, ctx, es, func() *pb.StepRequest { return &pb.StepRequest{} }, keys)
		}
		store := func() *pb.StepRequest {
			return &pb.StepRequest{Stores: []*pb.Store{{ReqId: tag + "-store", Pages: uint32(len(key)), Hashes: packHashes(key)}}}
		}
		if st == peerStores {
			q = store
			break
		}
		outs = stepAll(t, ctx, es, store, keys)
		for r, out := range outs {
			if len(out.Errors) > 0 || len(out.Plans) == 0 {
				fail("rank %d: the store step planned %d copies, errors %v: the ranks owe nothing", r, len(out.Plans), out.Errors)
			}
		}
	case peerExchange:
		q = func() *pb.StepRequest { return &pb.StepRequest{} }
	}
	type result struct {
		out *pb.StepReply
		err error
	}
	res := make([]chan result, n)
	// With the engine as the transport the others' step returns at once
	// (its tick waits for the frontier after it): they made a step the
	// victim never made, and hear of the end at their next.
	inStep := st.blocked() && s.cfg.Group != GroupEngine
	if st.blocked() && !inStep {
		for _, r := range others {
			out, err := es[r].run(ctx, q(), keys)
			if err != nil || len(out.Errors) > 0 {
				fail("rank %d: a step without the victim: %v %v", r, err, out.GetErrors())
			}
		}
	}
	if inStep {
		for _, r := range others {
			res[r] = make(chan result, 1)
			go func() {
				out, err := es[r].run(ctx, q(), keys)
				res[r] <- result{out, err}
			}()
		}
		for _, r := range others {
			waitFor(t, fmt.Sprintf("%s: rank %d in the exchange", name, r), func() bool { return s.ranks[r].exchanging.Load() == 1 })
		}
	}

	// The end.
	old := es[victim].reg.Session
	switch way {
	case endClose:
		if _, err := es[victim].cl.Close(ctx, &pb.CloseRequest{Session: old, BootId: es[victim].reg.BootId}); err != nil {
			fail("close: %v", err)
		}
	case endDrop:
		es[victim].close()
	case endTTL:
		// Silence: serve expires it.
	case endReRegister:
		if err := es[victim].register(ctx); err != nil {
			fail("register again: %v", err)
		}
	}
	waitFor(t, name+": the victim's session ends", func() bool { return s.rankOf(old) == nil })
	if way == endDrop {
		es[victim] = dialEngine(t, sock, uint32(victim), uint32(n))
		es[victim].engineGroup = s.cfg.Group == GroupEngine
	}

	// The other ranks hear which rank's session ended and why: a step in
	// flight in its reply, an idle rank at its next step.
	want := fmt.Sprintf("rank %d's session ended (%s)", victim, way.why())
	for _, r := range others {
		var out *pb.StepReply
		var err error
		if inStep {
			got := <-res[r]
			out, err = got.out, got.err
		} else {
			out, err = es[r].run(ctx, &pb.StepRequest{}, keys)
		}
		if err != nil {
			fail("rank %d: step: %v", r, err)
		}
		msg := fmt.Sprint(out.GetErrors())
		ok := strings.Contains(msg, want)
		if way == endTTL && !inStep {
			// Every idle session of the group expires within the same
			// TTL; whichever rank's expiry came first named itself.
			ok = strings.Contains(msg, "session ended (expired)") || strings.Contains(msg, "ended: expired")
		}
		if !ok {
			fail("rank %d: step errors %s, want one saying %q", r, msg, want)
		}
	}

	// The next engine: every rank registers (the re-registered victim
	// already did) and steps cleanly, hitting the warm pages, verified.
	for r, e := range es {
		if way == endReRegister && r == victim {
			continue
		}
		if err := e.register(ctx); err != nil {
			fail("rank %d: register after the end: %v", r, err)
		}
		e.verified, e.wrong = 0, 0
	}
	next := chain(tag+"-prefix", 4, 6, tag+"-next")
	got := driveGroup(t, ctx, es, tag+"-next", next)
	again := driveGroup(t, ctx, es, tag+"-again", next)
	for r, e := range es {
		if got[r].HitPages < 4 || again[r].HitPages < 6 {
			fail("rank %d: hit %d and %d pages, want the 4 of the warm prefix then all 6", r, got[r].HitPages, again[r].HitPages)
		}
		if e.wrong != 0 || e.verified < 10 {
			fail("rank %d: verified %d pages, %d wrong", r, e.verified, e.wrong)
		}
	}
	// Leave the group idle for the next case: the sessions close.
	for _, e := range es {
		if _, err := e.cl.Close(ctx, &pb.CloseRequest{Session: e.reg.Session, BootId: e.reg.BootId}); err != nil && !strings.Contains(err.Error(), "ended") {
			fail("close at the end: %v", err)
		}
	}
}

// TestEpochBarrier: a new epoch whose broadcast has not reached the ranks
// yet (serve.advance alone, as when another rank's session just ended).
// A Step of an old epoch's session is refused, naming the cause, and
// applies nothing; a Register joins the current epoch first, so the next
// engine's ranks start from the same state and step cleanly.
func TestEpochBarrier(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			s, sock, _ := startWith(t, Config{DataDir: t.TempDir(), Ranks: n, SessionTTL: time.Minute})
			es := openGroup(t, ctx, s, sock, n)
			key := chain("barrier", 4, 6, "a")
			driveGroup(t, ctx, es, "a", key)
			for range 3 {
				stepAll(t, ctx, es, func() *pb.StepRequest { return &pb.StepRequest{} }, nil)
			}

			cur := s.current()
			s.advance(cur.n, &sessionEnded{rank: n - 1, why: "closed"})
			// Rank 0's step (with a lookup) of the old epoch's session.
			out, err := es[0].run(ctx, lookupStep("b", key)(), nil)
			if err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("rank %d's session ended (closed); register again", n-1)
			if msg := fmt.Sprint(out.GetErrors()); !strings.Contains(msg, want) || len(out.Lookups) != 0 {
				t.Fatalf("old epoch's step: errors %s, %d lookups answered; want only an error saying %q", msg, len(out.Lookups), want)
			}
			// The next engine registers rank by rank, the broadcast
			// never having reached the others.
			for r := n - 1; r >= 0; r-- {
				if err := es[r].register(ctx); err != nil {
					t.Fatal(err)
				}
			}
			res := driveGroup(t, ctx, es, "c", key)
			for r, e := range es {
				if res[r].HitPages != uint32(len(key)) || e.wrong != 0 {
					t.Fatalf("rank %d: hit %d of %d pages, %d wrong", r, res[r].HitPages, len(key), e.wrong)
				}
			}
		})
	}
}

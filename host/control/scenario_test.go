package control

import (
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/kvtier/kvtier/host/placement"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
)

// TestScenarios runs the data-driven scenario files in testdata, one per
// behaviour the Machine pins. Each command's output is what the Machine
// put in Ready since the previous command (then consumed with Advance).
// Regenerate with -rewrite and review the diff.
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		h := &harness{names: map[pagehash.Hash]string{}, store: map[pagehash.Hash]bool{}}
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			return h.run(t, td)
		})
	})
}

// harness is the driver of one scenario: a Machine in a group of one, a
// simulated Store (the set of durable pages) and the page names.
type harness struct {
	m     *Machine
	opts  Options
	names map[pagehash.Hash]string
	store map[pagehash.Hash]bool
}

func (h *harness) run(t *testing.T, td *datadriven.TestData) string {
	switch td.Cmd {
	case "new":
		return h.newMachine(t, td)
	case "state":
		return h.state()
	case "digest":
		d := h.m.Digest()
		s := "digest " + hex.EncodeToString(d[:6])
		if td.HasArg("fresh") {
			f, err := New(h.opts)
			if err != nil {
				t.Fatal(err)
			}
			s += fmt.Sprintf("\nequal to a new machine's: %t", f.Digest() == d)
		}
		return s
	case "stats":
		return strings.Join(h.m.Stats(), "\n")
	case "tick":
		return h.tick(t, td)
	case "ack":
		return h.ack(t, td)
	case "store":
		var names string
		td.ScanArgs(t, "hashes", &names)
		for _, n := range strings.Split(names, ",") {
			h.store[h.name(n)] = true
		}
		return "ok"
	case "gc":
		var names string
		td.ScanArgs(t, "hashes", &names)
		for _, n := range strings.Split(names, ",") {
			delete(h.store, h.name(n))
		}
		return "ok"
	}
	line := td.FullCmd()
	if _, v, ok := strings.Cut(line, "hashes="); ok {
		v, _, _ = strings.Cut(v, " ")
		for _, n := range strings.Split(v, ",") {
			h.name(n)
		}
	}
	e, err := ParseEvent(line)
	if err != nil {
		return "parse error: " + err.Error()
	}
	before := h.m.Digest()
	if err := h.m.Apply(e); err != nil {
		if h.m.Digest() != before {
			t.Fatalf("%s: refused event changed the digest", td.Pos)
		}
		return "error: " + err.Error()
	}
	return h.drain()
}

func (h *harness) name(n string) pagehash.Hash {
	hs := PageHash(n)
	h.names[hs] = n
	return hs
}

func (h *harness) newMachine(t *testing.T, td *datadriven.TestData) string {
	o := DefaultOptions()
	o.L1Pages, o.L2 = 16, SimpleLayout(16, 4096)
	o.DigestEvery = 0
	o.EvictAhead = 0 // NB: the scenarios pin eviction per admission unless they say evict-ahead
	o.Logger = slog.New(slog.DiscardHandler)
	clock := time.Unix(0, 0)
	o.LogClock = func() time.Time { return clock }
	for _, a := range td.CmdArgs {
		v := ""
		if len(a.Vals) > 0 {
			v = a.Vals[0]
		}
		num := func() int {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("%s: %s=%q: %v", td.Pos, a.Key, v, err)
			}
			return n
		}
		switch a.Key {
		case "policy":
			p, err := ParseWritePolicy(v)
			if err != nil {
				t.Fatal(err)
			}
			o.WritePolicy = p
		case "l1":
			o.L1Pages = int64(num())
		case "l2":
			o.L2 = SimpleLayout(int64(num()), 4096)
		case "no-l3":
			o.L3 = false
		case "spill-cap":
			o.SpillQueueCap = num()
		case "spill-inflight":
			o.SpillInflight = num()
		case "reload-cap":
			o.ReloadMaxInflight = num()
		case "ttl":
			o.ReloadTTL = uint64(num())
		case "digest-every":
			o.DigestEvery = uint64(num())
		case "watermark":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			o.FreeRoomRatio = f
		case "evict-ahead":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			o.EvictAhead = f
		default:
			t.Fatalf("%s: unknown option %s", td.Pos, a.Key)
		}
	}
	m, err := New(o)
	if err != nil {
		return "error: " + err.Error()
	}
	h.m, h.opts = m, o
	h.store = map[pagehash.Hash]bool{}
	return fmt.Sprintf("policy=%s l1=%d l2=%d l3=%t spill-cap=%d spill-inflight=%d reload-cap=%d ttl=%d",
		o.WritePolicy, o.L1Pages, o.L2.Kinds[0].Pages(), o.L3, o.SpillQueueCap, o.SpillInflight, o.ReloadMaxInflight, o.ReloadTTL)
}

// tick reduces the Machine's contribution over a group of one and applies
// the frontier.
func (h *harness) tick(t *testing.T, td *datadriven.TestData) string {
	c := h.m.Ready().Contribution
	f, err := Reduce(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.m.Tick(f); err != nil {
		return "error: " + err.Error()
	}
	out := "frontier " + f.String()
	if d := h.drain(); d != "ok" {
		out += "\n" + d
	}
	return out
}

// ack completes the next stage of every op in flight, ok unless listed in
// fail=op,op. A spill's put stores its pages in the simulated Store at the
// durable stage; a lookup answers the longest prefix the Store holds; a
// get succeeds when the Store holds every page.
func (h *harness) ack(t *testing.T, td *datadriven.TestData) string {
	fail := map[OpID]bool{}
	if td.HasArg("fail") {
		var s string
		td.ScanArgs(t, "fail", &s)
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				t.Fatal(err)
			}
			fail[OpID(n)] = true
		}
	}
	only := map[OpID]bool{}
	if td.HasArg("ops") {
		var s string
		td.ScanArgs(t, "ops", &s)
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				t.Fatal(err)
			}
			only[OpID(n)] = true
		}
	}
	var lines []string
	for _, id := range h.m.ops.AppendIDs(nil) {
		o := h.m.ops.Get(id)
		if len(only) > 0 && !only[id] {
			continue
		}
		ok := !fail[id]
		var st Stage
		var err error
		switch o.kind {
		case opBackup, opLoadBack:
			st = StageCopied
		case opSpill:
			st = StageGathered
			if o.local[StageGathered].done {
				st = StageDurable
			}
			if o.local[StageDurable].done {
				continue
			}
		case opLookup:
			if o.local[StageFound].done {
				continue
			}
			n := 0
			for n < len(o.hashes) && h.store[o.hashes[n]] {
				n++
			}
			if !ok {
				n = 0
			}
			if err := h.m.Longest(id, n); err != nil {
				t.Fatal(err)
			}
			lines = append(lines, fmt.Sprintf("longest op=%d pages=%d", id, n))
			continue
		case opReload:
			st = StageLoaded
			for _, hs := range o.hashes {
				ok = ok && h.store[hs]
			}
		}
		if o.local[st].done {
			continue
		}
		if err = h.m.Done(id, st, ok); err != nil {
			t.Fatal(err)
		}
		if st == StageDurable && ok {
			for _, hs := range o.hashes {
				h.store[hs] = true
			}
		}
		lines = append(lines, fmt.Sprintf("done op=%d stage=%s %s", id, st, map[bool]string{true: "ok", false: "fail"}[ok]))
	}
	if len(lines) == 0 {
		return "nothing to ack"
	}
	return strings.Join(lines, "\n")
}

func (h *harness) hashes(hs []pagehash.Hash) string {
	s := make([]string, len(hs))
	for i, x := range hs {
		if n, ok := h.names[x]; ok {
			s[i] = n
		} else {
			s[i] = hex.EncodeToString(x[:3])
		}
	}
	return strings.Join(s, ",")
}

func ranges(rs []placement.Range) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprintf("%d+%d", r.Start, r.Pages)
	}
	return strings.Join(s, ",")
}

// drain renders what the Machine put in Ready and consumes it.
func (h *harness) drain() string {
	r := h.m.Ready()
	h.m.Advance()
	var b []string
	for _, x := range r.Matches {
		s := fmt.Sprintf("matched req=%d node=%d pages=%d l1=%d l2=%d", x.Req, x.Node, x.Pages, x.L1, x.L2)
		if x.Held {
			s += " held"
		}
		b = append(b, s)
	}
	for _, p := range r.Placements {
		b = append(b, fmt.Sprintf("place req=%d node=%d l1=%s", p.Req, p.Node, ranges(p.L1)))
	}
	for _, c := range r.Copies {
		b = append(b, fmt.Sprintf("copy op=%d %s node=%d at=%d l1=%s l2=%s", c.Op, c.Dir, c.Node, c.Depth, ranges(c.L1), ranges(c.L2)))
	}
	for _, p := range r.Puts {
		b = append(b, fmt.Sprintf("put op=%d node=%d at=%d pages=%s spans=%d", p.Op, p.Node, p.Depth, h.hashes(p.Hashes), len(p.Spans)))
	}
	for _, l := range r.Lookups {
		b = append(b, fmt.Sprintf("lookup op=%d at=%d pages=%s", l.Op, l.Depth, h.hashes(l.Hashes)))
	}
	for _, g := range r.Gets {
		b = append(b, fmt.Sprintf("get op=%d at=%d pages=%s spans=%d", g.Op, g.Depth, h.hashes(g.Hashes), len(g.Spans)))
	}
	for _, d := range r.Deletes {
		b = append(b, fmt.Sprintf("delete op=%d at=%d pages=%s", d.Op, d.Depth, h.hashes(d.Hashes)))
	}
	for _, x := range r.Touches {
		b = append(b, fmt.Sprintf("touch at=%d pages=%s", x.Depth, h.hashes(x.Hashes)))
	}
	for _, x := range r.Holds {
		b = append(b, fmt.Sprintf("hold req=%d", x))
	}
	for _, x := range r.Unholds {
		b = append(b, fmt.Sprintf("unhold req=%d %s", x.Req, x.Reason))
	}
	for _, s := range r.Skips {
		b = append(b, s.String())
	}
	if r.Digest != nil {
		b = append(b, "digest "+hex.EncodeToString(r.Digest[:6]))
	}
	if len(b) == 0 {
		return "ok"
	}
	return strings.Join(b, "\n")
}

// state renders the tree with every node's markers, the free pages, the
// spill queue and the held requests.
func (h *harness) state() string {
	nodes := h.m.Nodes()
	kids := map[policy.NodeID][]NodeState{}
	for _, n := range nodes {
		kids[n.Parent] = append(kids[n.Parent], n)
	}
	var b []string
	var walk func(id policy.NodeID, depth int)
	walk = func(id policy.NodeID, depth int) {
		for _, n := range kids[id] {
			s := fmt.Sprintf("%s[%d] %s res=%s", strings.Repeat("  ", depth), n.ID, h.hashes(n.Hashes), n.Residency)
			if n.Locks > 0 {
				s += fmt.Sprintf(" locks=%d", n.Locks)
			}
			if n.BackupPending {
				s += " backup-pending"
			}
			if n.Spill != "" {
				s += " spill=" + n.Spill
			}
			if n.Loading {
				s += " loading"
			}
			s += fmt.Sprintf(" hits=%d", n.Hits)
			b = append(b, s)
			walk(n.ID, depth+1)
		}
	}
	walk(0, 0)
	l1, l2 := h.m.Free()
	b = append(b, fmt.Sprintf("free l1=%d l2=%d", l1, l2))
	if q := h.m.SpillQueue(); len(q) > 0 {
		b = append(b, fmt.Sprintf("spill queue %v", q))
	}
	if held := h.m.Held(); len(held) > 0 {
		b = append(b, fmt.Sprintf("held %v", held))
	}
	if err := h.m.CheckInvariants(); err != nil {
		b = append(b, "INVARIANT: "+err.Error())
	}
	return strings.Join(b, "\n")
}

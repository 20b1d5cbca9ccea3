package host_test

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/kvtier/kvtier/host"
	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/internal/crc32c"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

// putRecorder is a Store that records every PutRequest it is given and
// passes the call on.
type putRecorder struct {
	tiers.Store
	mu   sync.Mutex
	puts []tiers.PutRequest
}

func (r *putRecorder) Put(ctx context.Context, batch []tiers.PutRequest) (tiers.BatchID, error) {
	r.mu.Lock()
	r.puts = append(r.puts, batch...)
	r.mu.Unlock()
	return r.Store.Put(ctx, batch)
}

// enginePoolYAML is stackYAML with the engine's L1 pool (the engine runs
// the copies from plans, as under serve).
func enginePoolYAML(dir string) string {
	y := stackYAML(dir, memstoreEntry)
	return strings.Replace(y, "use: host\n    config: {pages: 8, layers: 4, workers: 1}", "use: engine\n    config: {pages: 8, layers: 1}", 1)
}

// TestNodeCarriesPlanSums: the sums an engine reports with a backup plan
// (CompletePlan) go out on the spills of exactly those pages, and on no
// later occupant of the same slab pages. Forty 4-page keys through a
// 64-page slab reuse every slab page; each key's backup reports its sums,
// reports none, or fails (seeded), so a sum left behind by an earlier
// occupant would show on a later key's spill. Sums that do not fit the
// plan are refused (ErrPlanSums) and the plan stays outstanding.
func TestNodeCarriesPlanSums(t *testing.T) {
	dir := t.TempDir()
	s := openStack(t, enginePoolYAML(dir), dir)
	if !host.RunsPlans(s) {
		t.Fatal("the stack's pool does not run plans")
	}
	rec := &putRecorder{Store: s.Stores[0].Store}
	s.Stores[0].Store = rec
	base := control.DefaultOptions()
	base.DigestEvery = 0
	base.Logger = slog.New(slog.DiscardHandler)
	mo, err := host.MachineOptions(s, base, "")
	if err != nil {
		t.Fatal(err)
	}
	m, err := control.New(mo)
	if err != nil {
		t.Fatal(err)
	}
	n, err := host.New(s, m, host.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	ctx := context.Background()

	// want is the sum each key page's spill must carry; bare the pages
	// whose spill must carry none.
	want := map[pagehash.Hash]uint32{}
	bare := map[pagehash.Hash]bool{}
	rng := rand.New(rand.NewPCG(27, 1))
	const (
		withSums = iota
		noSums
		failed
	)
	var plans []host.PlannedCopy
	refused := 0
	// complete runs the plans made since the last call: a load from the
	// slab is reported ok; a backup of key k as mode says.
	complete := func(k []pagehash.Hash, l1 map[int]int, mode int) {
		t.Helper()
		plans = n.TakePlans(plans[:0])
		for i := 0; i < len(plans); {
			j := i
			for j < len(plans) && plans[j].Batch == plans[i].Batch {
				j++
			}
			pl := plans[i:j]
			i = j
			id := pl[0].Batch
			if !pl[0].ToSlab {
				if err := n.CompletePlan(id, nil, nil); err != nil {
					t.Fatal(err)
				}
				continue
			}
			sums := make([]uint32, len(pl))
			for x, pc := range pl {
				page := k[l1[pc.Copy.Page]]
				sums[x] = rng.Uint32()
				switch mode {
				case withSums:
					want[page] = sums[x]
				default:
					bare[page] = true
				}
			}
			// Sums that do not fit are refused whole, changing nothing.
			if err := n.CompletePlan(id, nil, sums[1:]); !errors.Is(err, host.ErrPlanSums) || !n.PlanOutstanding(id) {
				t.Fatalf("plan %d: one sum short: %v (outstanding %t), want ErrPlanSums and outstanding", id, err, n.PlanOutstanding(id))
			}
			refused++
			var why error
			switch mode {
			case noSums:
				sums = nil
			case failed:
				why = errors.New("the engine's copy failed")
			}
			if err := n.CompletePlan(id, why, sums); err != nil {
				t.Fatal(err)
			}
		}
	}
	tick := func() {
		t.Helper()
		complete(nil, nil, noSums)
		if err := n.Settle(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := n.Tick(ctx); err != nil {
			t.Fatal(err)
		}
		complete(nil, nil, noSums)
	}
	modes := [3]int{}
	for c := range 40 {
		req := control.ReqID(c + 1)
		k := key(c, 4)
		rd, err := n.Apply(ctx, control.Event{Kind: control.EvMatch, Req: req, Pages: len(k), Hashes: k})
		if err != nil {
			t.Fatal(err)
		}
		for wait := rd.Matches[len(rd.Matches)-1].Held; wait; {
			tick()
			wait = n.Loading(req) || held(n, req)
		}
		rd, err = n.Apply(ctx, control.Event{Kind: control.EvInsert, Req: req, Pages: len(k), Hashes: k})
		if err != nil {
			t.Fatal(err)
		}
		l1 := map[int]int{} // L1 page -> index in k
		for _, p := range rd.Placements {
			if p.Req != req {
				continue
			}
			i := len(k)
			for _, r := range p.L1 {
				i -= int(r.Pages)
			}
			for _, r := range p.L1 {
				for pg := r.Start; pg < r.Start+r.Pages; pg++ {
					l1[int(pg)] = i
					i++
				}
			}
		}
		mode := rng.IntN(3)
		modes[mode]++
		complete(k, l1, mode)
		tick()
		for _, e := range []control.EventKind{control.EvFinish, control.EvRelease} {
			if _, err := n.Apply(ctx, control.Event{Kind: e, Req: req}); err != nil {
				t.Fatal(err)
			}
		}
		tick()
	}
	for range 10 {
		tick()
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var carried, none int
	for _, p := range rec.puts {
		switch w, ok := want[p.Key.Hash]; {
		case ok && (!p.HasSum || p.Sum != w):
			t.Errorf("spill of %x: sum %#x (has %t), want the engine's %#x", p.Key.Hash[:8], p.Sum, p.HasSum, w)
		case !ok && p.HasSum:
			t.Errorf("spill of %x: sum %#x, want none (its plan reported none or failed; a sum left by an earlier page in its slab span?)", p.Key.Hash[:8], p.Sum)
		case ok:
			carried++
		default:
			none++
		}
	}
	t.Logf("modes (sums, none, failed) %v; spills with the engine's sum %d, without %d; refused completions %d", modes, carried, none, refused)
	if carried == 0 || none == 0 || refused == 0 || modes[withSums] == 0 || modes[noSums] == 0 || modes[failed] == 0 {
		t.Fatalf("the run did not cover every case: modes %v, carried %d, none %d", modes, carried, none)
	}
	if st := n.Stats(); st.L2ToL3 == 0 {
		t.Fatalf("nothing spilled: %+v", st)
	}
	// The recorder hides the memstore's kind: a store that keeps no sums,
	// so the Node checks the slab at each gather against the engine's
	// sum. These sums are random, never the slab's bytes: every spill that
	// carried one failed there, and every other spill went through.
	if st := n.Stats(); st.SumFailures != int64(carried) {
		t.Fatalf("%d spills failed their gather check, want the %d that carried a (random) sum", st.SumFailures, carried)
	}
	// ... and the Machine deleted the copies the store gathered: none of
	// those pages is held below, under the store's own checksum.
	for h := range want {
		if got, err := rec.Store.LongestPrefix(ctx, 0, []pagehash.Hash{h}); err != nil || got != 0 {
			t.Fatalf("page %x, spilled only with a sum that failed, is in the store (%d, %v)", h[:8], got, err)
		}
	}
	if err := n.Machine().CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestNodeCarriesPoolSums: the host pool takes each page's CRC-32C as it
// copies the page into the slab (Ack.Sum), and every spill of that page
// carries it: the sum of the bytes the engine wrote, never one the store
// computes over the slab later. Twenty 4-page conversations spill through
// l3disk (which keeps the producer's sums and verifies them at every
// read); the first one, reloaded from it, reads back with the right
// bytes.
func TestNodeCarriesPoolSums(t *testing.T) {
	dir := t.TempDir()
	s := openStack(t, stackYAML(dir, l3diskEntry(dir)), dir)
	if host.RunsPlans(s) {
		t.Fatal("the stack's pool runs plans; want the host pool")
	}
	rec := &putRecorder{Store: s.Stores[0].Store}
	s.Stores[0].Store = rec
	d := newDriver(t, s, host.Options{})
	t.Cleanup(func() { d.n.Close() })
	want := map[tiers.Key]uint32{}
	kinds := s.Config.Payload.Kinds
	for i := range 20 {
		k := key(i, 4)
		for _, h := range k {
			for kind, spec := range kinds {
				b := make([]byte, spec.PageBytes)
				host.Payload(b, h, tiers.PayloadKind(kind))
				want[tiers.Key{Hash: h, Kind: tiers.PayloadKind(kind)}] = crc32c.Checksum(b)
			}
		}
		if got := d.request(control.ReqID(i+1), k); got != 0 {
			t.Fatalf("conversation %d: %d hits on first sight", i, got)
		}
	}
	if got := d.request(101, key(0, 4)); got != 4 {
		t.Fatalf("old conversation: %d hits after reload, want 4 (stats %+v)", got, d.n.Stats())
	}
	if d.eng.WrongBytes != 0 {
		t.Fatalf("%d wrong bytes", d.eng.WrongBytes)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.puts) == 0 {
		t.Fatal("nothing spilled")
	}
	for _, p := range rec.puts {
		w, ok := want[p.Key]
		switch {
		case !ok:
			t.Errorf("spill of %v: not a page of the conversations", p.Key)
		case !p.HasSum || p.Sum != w:
			t.Errorf("spill of %v: sum %#x (has %t), want the pool's %#x", p.Key, p.Sum, p.HasSum, w)
		}
	}
	// The recorder hides l3disk's SumKeeper: the Node checked every
	// gather against the pool's sum, and every one matched.
	if st := d.n.Stats(); st.SumFailures != 0 {
		t.Fatalf("%d spills failed their gather check against the pool's right sums", st.SumFailures)
	}
	t.Logf("%d spills, each with the pool's sum; stats %+v", len(rec.puts), d.n.Stats())
}

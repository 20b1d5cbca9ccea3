package serve

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/host/replay"
	"github.com/kvtier/kvtier/loadgen"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/workload"
)

// checkRemapped reads one recording file and checks it is a valid trace
// whose ids are 0, 1, 2, ... in order of first appearance, each id one
// page key throughout the file (want[i] are the keys of line i).
func checkRemapped(t *testing.T, path string, want [][]pagehash.Hash) {
	t.Helper()
	reqs, err := workload.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(reqs) != len(want) {
		t.Fatalf("%s: %d lines, want %d", path, len(reqs), len(want))
	}
	byID := map[uint64]pagehash.Hash{}
	next := uint64(0)
	last := int64(-1)
	for i, r := range reqs {
		if r.InputLength != len(want[i])*workload.BlockTokens || len(r.HashIDs) != len(want[i]) {
			t.Fatalf("%s line %d: input_length %d with %d ids, want %d pages", path, i+1, r.InputLength, len(r.HashIDs), len(want[i]))
		}
		if r.Timestamp < last {
			t.Fatalf("%s line %d: timestamp %d before %d", path, i+1, r.Timestamp, last)
		}
		last = r.Timestamp
		for j, id := range r.HashIDs {
			h, seen := byID[id]
			switch {
			case !seen && id != next:
				t.Fatalf("%s line %d: new id %d, want %d (ids in order of first appearance)", path, i+1, id, next)
			case !seen:
				byID[id] = want[i][j]
				next++
			case h != want[i][j]:
				t.Fatalf("%s line %d: id %d stands for two page keys", path, i+1, id)
			}
		}
	}
}

// TestRecorderRotatesAndRemaps: past its size a recording goes on in the
// next file, each file remaps its ids from 0, the oldest beyond keep are
// removed, and nothing is lost or reordered.
func TestRecorderRotatesAndRemaps(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rec.jsonl")
	r, err := openRecorder(path, 400, 2, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	h := func(n int) pagehash.Hash {
		var x pagehash.Hash
		x[0], x[1] = byte(n), byte(n>>8)
		return x
	}
	var lines [][]pagehash.Hash
	for i := range 40 {
		k := []pagehash.Hash{h(1), h(2), h(3 + i%5)}
		if i%3 == 0 {
			k = k[:1]
		}
		lines = append(lines, k)
		r.Record(time.Now(), k)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if r.q.Dropped() != 0 {
		t.Fatalf("%d dropped", r.q.Dropped())
	}
	if r.part < 3 {
		t.Fatalf("%d parts after 40 lines of a 400-byte file, want rotation", r.part+1)
	}
	// Parts 0..part-2 were removed (keep 2); the last two hold the tail.
	for n := 0; n <= r.part-2; n++ {
		if _, err := os.Stat(r.partPath(n)); !os.IsNotExist(err) {
			t.Fatalf("part %d kept: %v", n, err)
		}
	}
	a, err := workload.ReadFile(r.partPath(r.part - 1))
	if err != nil {
		t.Fatal(err)
	}
	b, err := workload.ReadFile(r.partPath(r.part))
	if err != nil {
		t.Fatal(err)
	}
	tail := lines[len(lines)-len(a)-len(b):]
	checkRemapped(t, r.partPath(r.part-1), tail[:len(a)])
	checkRemapped(t, r.partPath(r.part), tail[len(a):])
	// Record after Close is a no-op, never a panic.
	r.Record(time.Now(), lines[0])
}

// TestRecordLoadgenReplays records a loadgen run against serve and
// replays the recording: it is the run's lookups, in order, with ids a
// consistent relabelling of the pages, so its replay equals the replay of
// the requests loadgen sent, for every policy and capacity.
func TestRecordLoadgenReplays(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	path := filepath.Join(t.TempDir(), "live.jsonl")
	_, sock, stop := startWith(t, Config{DataDir: t.TempDir(), Record: path})
	g := workload.DefaultGeneratorConfig()
	g.Requests = 300
	reqs, err := workload.Generate(g)
	if err != nil {
		t.Fatal(err)
	}
	const maxPages = 48
	res, err := loadgen.Run(ctx, loadgen.Config{Socket: sock, Ranks: 1, Requests: reqs, MaxPages: maxPages, NoPayload: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 0 {
		t.Fatalf("loadgen: %d errors (%s)", res.Errors, res.FirstError)
	}
	stop()
	// What loadgen sent: each request's ids cut to maxPages.
	sent := make([]workload.Request, len(reqs))
	for i, r := range reqs {
		n := min(len(r.HashIDs), maxPages)
		sent[i] = workload.Request{Timestamp: r.Timestamp, InputLength: n * workload.BlockTokens, HashIDs: r.HashIDs[:n]}
	}
	got, err := workload.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(sent) {
		t.Fatalf("recorded %d lookups, loadgen sent %d", len(got), len(sent))
	}
	// The recorded ids relabel the sent ids one to one.
	fwd, back := map[uint64]uint64{}, map[uint64]uint64{}
	for i := range got {
		if len(got[i].HashIDs) != len(sent[i].HashIDs) {
			t.Fatalf("lookup %d: %d pages recorded, %d sent", i, len(got[i].HashIDs), len(sent[i].HashIDs))
		}
		for j, id := range got[i].HashIDs {
			s := sent[i].HashIDs[j]
			if f, ok := fwd[s]; ok && f != id {
				t.Fatalf("lookup %d page %d: sent id %d recorded as %d and %d", i, j, s, f, id)
			}
			if b, ok := back[id]; ok && b != s {
				t.Fatalf("lookup %d page %d: recorded id %d stands for sent %d and %d", i, j, id, b, s)
			}
			fwd[s], back[id] = id, s
		}
	}
	reg, err := builtin.Policies()
	if err != nil {
		t.Fatal(err)
	}
	trGot, err := replay.Compile(path, got)
	if err != nil {
		t.Fatal(err)
	}
	trSent, err := replay.Compile("sent", sent)
	if err != nil {
		t.Fatal(err)
	}
	for _, pol := range []string{"adaptive", "lru", "s3fifo"} {
		for _, capacity := range []int64{64 * 512, 256 * 512, 1024 * 512} {
			t.Run(fmt.Sprintf("%s/%d", pol, capacity), func(t *testing.T) {
				var rates [2]float64
				for k, tr := range []*replay.Trace{trGot, trSent} {
					ev, err := replay.NewEvictor(reg, tr, replay.Spec{Name: pol})
					if err != nil {
						t.Fatal(err)
					}
					r, err := replay.Run(tr, ev, capacity, nil)
					if err != nil {
						t.Fatal(err)
					}
					rates[k] = r.HitRate
				}
				if rates[0] != rates[1] || rates[0] == 0 {
					t.Fatalf("replayed hit rate of the recording %.12f, of what was sent %.12f", rates[0], rates[1])
				}
			})
		}
	}
}

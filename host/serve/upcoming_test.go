package serve

import (
	"context"
	"strings"
	"testing"
	"time"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/host/control"
)

// TestUpcomingPrefetchesFromL3: after a restart the pages are only in L3;
// a step whose upcoming list names four of eight keys prefetches those
// into L2, so their lookups later hit in L2 while the others come from L3.
func TestUpcomingPrefetchesFromL3(t *testing.T) {
	ctx := context.Background()
	srv, e, keys := restartWithL3(t, ctx)
	var ups []*pb.Upcoming
	for _, k := range keys[:4] {
		ups = append(ups, &pb.Upcoming{Pages: uint32(len(k)), Hashes: packHashes(k)})
	}
	// The engine sends its queue every step; the prefetches land meanwhile
	// (until the rank's published counters show 4 keys' bytes out of L3).
	var pageBytes int64
	for _, k := range srv.ranks[0].st.Config.Payload.Kinds {
		pageBytes += k.PageBytes
	}
	want := int64(4*len(keys[0])) * pageBytes
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := e.run(ctx, &pb.StepRequest{Upcoming: ups}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Errors) > 0 {
			t.Fatalf("upcoming refused: %v", out.Errors)
		}
		got := srv.ranks[0].snap.Load().node.L3ToL2
		if got >= want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s of hints, %d bytes reloaded from L3, want %d", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i, k := range keys {
		res := drive(t, ctx, e, "again"+reqName(i), k)
		hinted := i < 4
		switch {
		case res.HitPages != uint32(len(k)):
			t.Errorf("key %d: %d of %d pages hit", i, res.HitPages, len(k))
		case hinted && (res.L3Hit != 0 || res.L2Hit == 0):
			t.Errorf("hinted key %d: l2 %d, l3 %d pages, want all from L2 (prefetched)", i, res.L2Hit, res.L3Hit)
		case !hinted && res.L3Hit == 0:
			t.Errorf("key %d, not hinted: l2 %d, l3 %d pages, want a reload from L3", i, res.L2Hit, res.L3Hit)
		}
	}
	if e.wrong != 0 {
		t.Fatalf("%d wrong pages", e.wrong)
	}
}

// TestUpcomingBadInput: each bad upcoming key is refused alone, a list
// over control.MaxUpcoming whole; the step goes on.
func TestUpcomingBadInput(t *testing.T) {
	ctx := context.Background()
	_, sock, _ := startServer(t, t.TempDir(), 1)
	e := dialEngine(t, sock, 0, 1)
	if err := e.register(ctx); err != nil {
		t.Fatal(err)
	}
	good := chain("g", 4, 4, "")
	many := make([]*pb.Upcoming, control.MaxUpcoming+1)
	for i := range many {
		many[i] = &pb.Upcoming{Pages: uint32(len(good)), Hashes: packHashes(good)}
	}
	tests := []struct {
		name string
		ups  []*pb.Upcoming
		want []string // item: code substring
	}{
		{"fine", []*pb.Upcoming{{Pages: 4, Hashes: packHashes(good)}}, nil},
		{"no pages", []*pb.Upcoming{{Pages: 0}, {Pages: 4, Hashes: packHashes(good)}}, []string{"upcoming[0]: ERROR_CODE_INVALID no pages"}},
		{"short hashes", []*pb.Upcoming{{Pages: 4, Hashes: packHashes(good)[:40]}}, []string{"upcoming[0]: ERROR_CODE_INVALID"}},
		{"too many pages", []*pb.Upcoming{{Pages: 1 << 20, Hashes: nil}}, []string{"upcoming[0]: ERROR_CODE_LIMIT"}},
		{"too many keys", many, []string{"upcoming: ERROR_CODE_LIMIT"}},
		{"empty clears", nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := e.run(ctx, &pb.StepRequest{Upcoming: tc.ups}, nil)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, ie := range out.Errors {
				got = append(got, ie.Item+": "+ie.Code.String()+" "+ie.Message)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("errors %q, want %q", got, tc.want)
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(got[i], w) {
					t.Errorf("error %q, want %q...", got[i], w)
				}
			}
		})
	}
}

package control

import (
	"testing"

	"github.com/kvtier/kvtier/pagehash"
)

// TestMatchedL1 pins the driver's view: nothing for an unknown request;
// after an insert, the request's pages in page order with the L1 pages of
// its placement; the view leaves the digest alone.
func TestMatchedL1(t *testing.T) {
	m, err := New(DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	if got := m.MatchedL1(9, nil); len(got) != 0 {
		t.Fatalf("unknown request: %v", got)
	}
	hs := []pagehash.Hash{{1}, {2}, {3}}
	if err := m.Apply(Event{Kind: EvInsert, Req: 1, Pages: 3, Hashes: hs}); err != nil {
		t.Fatal(err)
	}
	rd := m.Ready()
	if len(rd.Placements) != 1 {
		t.Fatalf("placements %+v", rd.Placements)
	}
	var want []int64
	for _, r := range rd.Placements[0].L1 {
		for p := r.Start; p < r.Start+r.Pages; p++ {
			want = append(want, p)
		}
	}
	got := m.MatchedL1(1, nil)
	if len(got) != 3 {
		t.Fatalf("view %v", got)
	}
	for i, g := range got {
		if g.Hash != hs[i] || g.L1 != want[i] {
			t.Fatalf("page %d: %+v, want hash %x L1 %d", i, g, hs[i][:1], want[i])
		}
	}
	before := m.Digest()
	m.MatchedL1(1, nil)
	if m.Digest() != before {
		t.Fatal("the view changed the digest")
	}
}

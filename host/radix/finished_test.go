package radix

import (
	"reflect"
	"testing"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
)

// observingLRU is testLRU that also records finished requests.
type observingLRU struct {
	*testLRU
	finished []policy.RequestInfo
}

func (o *observingLRU) Finished(r policy.RequestInfo) { o.finished = append(o.finished, r) }

func TestFinishedReachesObserver(t *testing.T) {
	ev := &observingLRU{testLRU: newTestLRU()}
	tree, err := New(Options{PageTokens: 4, Tiers: 1, Residency: L1}, ev)
	if err != nil {
		t.Fatal(err)
	}
	hs := make([]pagehash.Hash, 3)
	for i := range hs {
		hs[i][0] = byte(i + 1)
	}
	leaf, _ := tree.InsertHashes(hs)
	clock := tree.Clock()
	tree.Finished(leaf, policy.RequestInfo{Leaf: 99, Time: 99, InputTokens: 12, OutputTokens: 7, MatchedPages: 0})
	tree.Finished(tree.Root(), policy.RequestInfo{OutputTokens: 1})
	tree.Finished(nil, policy.RequestInfo{OutputTokens: 2})
	if tree.Clock() != clock {
		t.Errorf("Finished moved the clock from %d to %d", clock, tree.Clock())
	}
	want := []policy.RequestInfo{
		{Leaf: leaf.ID(), Time: clock, InputTokens: 12, OutputTokens: 7},
		{Time: clock, OutputTokens: 1},
		{Time: clock, OutputTokens: 2},
	}
	if len(ev.finished) != len(want) {
		t.Fatalf("observer got %d reports, want %d: %+v", len(ev.finished), len(want), ev.finished)
	}
	for i := range want {
		if !reflect.DeepEqual(ev.finished[i], want[i]) {
			t.Errorf("report %d = %+v, want %+v (the tree sets Leaf and Time)", i, ev.finished[i], want[i])
		}
	}
	// An evictor without the ability is simply not told.
	plain, err := New(Options{PageTokens: 4, Tiers: 1, Residency: L1}, newTestLRU())
	if err != nil {
		t.Fatal(err)
	}
	last, _ := plain.InsertHashes(hs)
	plain.Finished(last, policy.RequestInfo{OutputTokens: 3})
}

package pluginhost

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kvtier/kvtier/internal/invariants"
	"github.com/kvtier/kvtier/plugins/internal/wire"
	"github.com/kvtier/kvtier/plugins/proto/storev1"
	"github.com/kvtier/kvtier/tiers"
)

// t0 is the fixed time the ledger tests open batches at.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// testLedger holds batch 7 of three items, sent to generation 1 at t0.
func testLedger() *ackLedger {
	var l ackLedger
	l.open(7, 1, 3, t0)
	return &l
}

func ack(batch uint64, i uint32, stage storev1.AckStage, code storev1.ResultCode) *storev1.Ack {
	return &storev1.Ack{Batch: batch, Index: i, Stage: stage, Code: code}
}

const (
	gathered = storev1.AckStage_ACK_STAGE_GATHERED
	durable  = storev1.AckStage_ACK_STAGE_DURABLE
	failed   = storev1.AckStage_ACK_STAGE_FAILED
	ok       = storev1.ResultCode_RESULT_CODE_OK
)

func TestAckLedgerApply(t *testing.T) {
	cases := []struct {
		name      string
		acks      []*storev1.Ack
		malformed bool
		queued    int
		left      int // items of batch 7 still open; 0: batch forgotten
	}{
		{"gathered then durable", []*storev1.Ack{ack(7, 0, gathered, ok), ack(7, 0, durable, ok)}, false, 2, 2},
		{"all durable", []*storev1.Ack{ack(7, 0, durable, ok), ack(7, 1, durable, ok), ack(7, 2, durable, ok)}, false, 3, 0},
		{"failed full", []*storev1.Ack{ack(7, 1, failed, storev1.ResultCode_RESULT_CODE_FULL)}, false, 1, 2},
		{"gathered only", []*storev1.Ack{ack(7, 2, gathered, ok)}, false, 1, 3},
		{"unknown batch", []*storev1.Ack{ack(8, 0, durable, ok)}, true, 0, 3},
		{"index out of range", []*storev1.Ack{ack(7, 3, durable, ok)}, true, 0, 3},
		{"unset stage", []*storev1.Ack{ack(7, 0, storev1.AckStage_ACK_STAGE_UNSPECIFIED, ok)}, true, 0, 3},
		{"second terminal", []*storev1.Ack{ack(7, 0, durable, ok), ack(7, 0, failed, storev1.ResultCode_RESULT_CODE_FAILED)}, true, 1, 2},
		{"second gathered", []*storev1.Ack{ack(7, 0, gathered, ok), ack(7, 0, gathered, ok)}, true, 1, 3},
		{"gathered after terminal", []*storev1.Ack{ack(7, 0, durable, ok), ack(7, 0, gathered, ok)}, true, 1, 2},
		{"durable with error code", []*storev1.Ack{ack(7, 0, durable, storev1.ResultCode_RESULT_CODE_FULL)}, true, 0, 3},
		{"failed with ok code", []*storev1.Ack{ack(7, 0, failed, ok)}, true, 0, 3},
		{"failed with unset code", []*storev1.Ack{ack(7, 0, failed, storev1.ResultCode_RESULT_CODE_UNSPECIFIED)}, true, 0, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := testLedger()
			out, err := l.apply(1, "unit", tc.acks, nil)
			if (err != nil) != tc.malformed {
				t.Fatalf("err = %v, malformed want %v", err, tc.malformed)
			}
			if err != nil && !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("err = %v, want ErrMalformed", err)
			}
			if len(out) != tc.queued {
				t.Fatalf("%d acks out, want %d: %+v", len(out), tc.queued, out)
			}
			left := 0
			if b := l.batches[7]; b != nil {
				left = b.left
			}
			if left != tc.left {
				t.Fatalf("batch 7 has %d items left, want %d", left, tc.left)
			}
			l.check()
		})
	}
}

func TestAckLedgerOtherGeneration(t *testing.T) {
	l := testLedger()
	if _, err := l.apply(2, "unit", []*storev1.Ack{ack(7, 0, durable, ok)}, nil); !errors.Is(err, wire.ErrMalformed) {
		t.Fatalf("ack from generation 2 for a batch of generation 1: %v, want ErrMalformed", err)
	}
}

func TestAckLedgerFailPendingEndsEveryItemOnce(t *testing.T) {
	cases := []struct {
		name   string
		gen    int // generation whose batches fail; -1 all
		before []*storev1.Ack
		failed int
	}{
		{"down after one durable and one gathered", 1, []*storev1.Ack{ack(7, 0, durable, ok), ack(7, 1, gathered, ok)}, 2},
		{"down with nothing acked", 1, nil, 3},
		{"closed", -1, []*storev1.Ack{ack(7, 2, durable, ok)}, 2},
		{"another generation down", 2, nil, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := testLedger()
			out, err := l.apply(1, "unit", tc.before, nil)
			if err != nil {
				t.Fatal(err)
			}
			down := errors.New("down")
			out, n := l.failPending(tc.gen, down, out)
			if n != tc.failed {
				t.Fatalf("failed %d items, want %d", n, tc.failed)
			}
			if tc.failed == 0 {
				if l.batches[7] == nil {
					t.Fatal("batch of another generation forgotten")
				}
				return
			}
			if len(l.batches) != 0 {
				t.Fatalf("batches left after failPending: %v", l.batches)
			}
			term := map[int]int{}
			for _, a := range out {
				if a.Stage != tiers.AckGathered {
					term[a.Index]++
				}
				if a.Stage == tiers.AckFailed && !errors.Is(a.Err, down) {
					t.Fatalf("failed ack %+v without the down error", a)
				}
			}
			for i := range 3 {
				if term[i] != 1 {
					t.Fatalf("item %d has %d terminal acks: %+v", i, term[i], out)
				}
			}
		})
	}
}

func TestAckLedgerOverdue(t *testing.T) {
	var l ackLedger
	l.open(1, 1, 1, t0)
	l.open(2, 1, 1, t0.Add(time.Second))
	l.open(3, 2, 1, t0.Add(-time.Hour)) // another generation's
	cases := []struct {
		now     time.Time
		timeout time.Duration
		want    tiers.BatchID
	}{
		{t0.Add(500 * time.Millisecond), time.Second, 0},
		{t0.Add(1500 * time.Millisecond), time.Second, 1},
		{t0.Add(3 * time.Second), time.Second, 1}, // the oldest of two overdue
	}
	for _, tc := range cases {
		if got, _ := l.overdue(1, tc.now, tc.timeout); got != tc.want {
			t.Errorf("overdue at %v after %v = batch %d, want %d", tc.now.Sub(t0), tc.timeout, got, tc.want)
		}
	}
	if !l.drop(2) || l.drop(2) {
		t.Fatal("drop: want true once, then false")
	}
}

// FuzzApplyAcks feeds arbitrary ack batches to the ledger: it must never
// panic, and however malformed the input, no item ever gets two terminal
// acks once the plugin is failed.
func FuzzApplyAcks(f *testing.F) {
	for _, acks := range [][]*storev1.Ack{
		{ack(7, 0, gathered, ok), ack(7, 0, durable, ok)},
		{ack(7, 2, failed, storev1.ResultCode_RESULT_CODE_BROKEN)},
		{ack(7, 0, durable, ok), ack(7, 0, durable, ok)},
	} {
		b, _ := proto.Marshal(&storev1.AckBatch{Acks: acks})
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var msg storev1.AckBatch
		if proto.Unmarshal(b, &msg) != nil {
			return
		}
		l := testLedger()
		out, err := l.apply(1, "fuzz", msg.GetAcks(), nil)
		if err != nil {
			out, _ = l.failPending(1, errors.New("down"), out)
		} else {
			out, _ = l.failPending(-1, errors.New("closed"), out)
		}
		term := map[int]int{}
		for _, a := range out {
			if a.Batch != 7 {
				t.Fatalf("ack for batch %d", a.Batch)
			}
			if a.Stage != tiers.AckGathered {
				term[a.Index]++
			}
		}
		for i := range 3 {
			if term[i] != 1 {
				t.Fatalf("item %d: %d terminal acks", i, term[i])
			}
		}
	})
}

func TestAckLedgerCheckCatchesBrokenBookkeeping(t *testing.T) {
	if !invariants.Enabled {
		t.Skip("needs -tags invariants or -race")
	}
	l := testLedger()
	l.batches[7].left = 2 // three items open
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "left=2 but 3 items open") {
			t.Fatalf("recovered %v, want the broken-invariant panic", r)
		}
	}()
	l.check()
}

// TestStoreIgnoresReplacedGenerationAcks: once a generation is replaced,
// its late acks are ignored (they were synthesized when it went down), not
// malformed; the serving generation's acks are queued and signalled.
func TestStoreIgnoresReplacedGenerationAcks(t *testing.T) {
	g1 := &storeGen{id: 1}
	s := &Store{ackReady: make(chan struct{}, 1)}
	s.spec = PluginSpec{Name: "unit"}
	s.gen = g1
	s.ledger = *testLedger()
	if err := s.applyAcks(g1, []*storev1.Ack{ack(7, 0, durable, ok)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.AckReady():
	default:
		t.Fatal("queued acks not signalled")
	}
	if n := s.failPending(1, errors.New("down")); n != 2 {
		t.Fatalf("failed %d items, want 2", n)
	}
	s.gen = &storeGen{id: 2}
	if err := s.applyAcks(g1, []*storev1.Ack{ack(7, 2, durable, ok)}); err != nil {
		t.Fatalf("late ack of a replaced process: %v", err)
	}
	if got := len(s.DrainAcks(nil)); got != 3 {
		t.Fatalf("%d acks queued, want 3 (one durable, two failed)", got)
	}
}

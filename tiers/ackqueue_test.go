package tiers

import (
	"errors"
	"slices"
	"sync"
	"testing"
)

// TestAckQueue runs push and drain scripts against one queue and checks
// every drain's acks and whether ready was signalled before it.
func TestAckQueue(t *testing.T) {
	boom := errors.New("boom")
	a := func(b BatchID, i int, st AckStage) Ack { return Ack{Batch: b, Index: i, Stage: st} }
	type step struct {
		push   [][]Ack // pushed in order before the drain
		dst    []Ack   // what the drain appends to
		want   []Ack
		signal bool // ready holds a signal before the drain
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"empty drain", []step{{want: nil}}},
		{"empty push neither queues nor signals", []step{{push: [][]Ack{nil, {}}, want: nil}}},
		{"one push", []step{{
			push:   [][]Ack{{a(1, 0, AckGathered), a(1, 0, AckDurable)}},
			want:   []Ack{a(1, 0, AckGathered), a(1, 0, AckDurable)},
			signal: true,
		}}},
		{"pushes keep their order and signals coalesce", []step{{
			push:   [][]Ack{{a(1, 0, AckGathered)}, {a(2, 0, AckCopied), a(2, 1, AckCopied)}, {a(1, 0, AckDurable)}},
			want:   []Ack{a(1, 0, AckGathered), a(2, 0, AckCopied), a(2, 1, AckCopied), a(1, 0, AckDurable)},
			signal: true,
		}}},
		{"drain appends to dst", []step{{
			push:   [][]Ack{{a(3, 1, AckCopied)}},
			dst:    []Ack{a(9, 9, AckCopied)},
			want:   []Ack{a(9, 9, AckCopied), a(3, 1, AckCopied)},
			signal: true,
		}}},
		{"drain empties the queue", []step{
			{push: [][]Ack{{{Batch: 1, Stage: AckFailed, Err: boom}}}, want: []Ack{{Batch: 1, Stage: AckFailed, Err: boom}}, signal: true},
			{want: nil},
			{push: [][]Ack{{a(2, 0, AckCopied)}}, want: []Ack{a(2, 0, AckCopied)}, signal: true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var q AckQueue
			ready := NewAckReady()
			for n, st := range tc.steps {
				for _, p := range st.push {
					q.Push(ready, p...)
				}
				var signalled bool
				select {
				case <-ready:
					signalled = true
				default:
				}
				if signalled != st.signal {
					t.Errorf("step %d: signalled %v, want %v", n, signalled, st.signal)
				}
				got := q.Drain(slices.Clone(st.dst))
				if !slices.EqualFunc(got, st.want, func(x, y Ack) bool {
					return x.Batch == y.Batch && x.Index == y.Index && x.Stage == y.Stage && x.Err == y.Err
				}) {
					t.Errorf("step %d: drained %v, want %v", n, got, st.want)
				}
			}
		})
	}
}

// TestAckQueueDrainClears: a drain leaves no ack (and so no error) in the
// queue's backing array, and the next pushes reuse it.
func TestAckQueueDrainClears(t *testing.T) {
	var q AckQueue
	q.Push(nil, Ack{Batch: 1, Stage: AckFailed, Err: errors.New("held")}, Ack{Batch: 1, Index: 1, Stage: AckFailed, Err: errors.New("held")})
	if got := q.Drain(nil); len(got) != 2 {
		t.Fatalf("drained %d acks, want 2", len(got))
	}
	for i, old := range q.acks[:cap(q.acks)] {
		if old != (Ack{}) {
			t.Fatalf("slot %d still holds %v after the drain", i, old)
		}
	}
	before := cap(q.acks)
	q.Push(nil, Ack{Batch: 2, Stage: AckCopied})
	if cap(q.acks) != before {
		t.Fatalf("push after a drain grew the queue from %d to %d slots, want it reused", before, cap(q.acks))
	}
}

// TestAckQueueConcurrent: producers push while a consumer drains on every
// signal; every ack arrives exactly once and each producer's acks in the
// order it pushed them.
func TestAckQueueConcurrent(t *testing.T) {
	const producers, batches, items = 4, 200, 3
	var q AckQueue
	ready := NewAckReady()
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for b := range batches {
				acks := make([]Ack, items)
				for i := range acks {
					acks[i] = Ack{Batch: BatchID(p*batches + b + 1), Index: i, Stage: AckCopied}
				}
				q.Push(ready, acks...)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	var got []Ack
	for finished := false; !finished; {
		select {
		case <-ready:
		case <-done:
			finished = true
		}
		got = q.Drain(got)
	}
	if len(got) != producers*batches*items {
		t.Fatalf("drained %d acks, want %d", len(got), producers*batches*items)
	}
	next := make([]int, producers) // next (batch, index) each producer owes, as batch*items+index
	for _, a := range got {
		p := int(a.Batch-1) / batches
		if at := (int(a.Batch-1)%batches)*items + a.Index; at != next[p] {
			t.Fatalf("producer %d: ack %v arrived at position %d, want %d", p, a, at, next[p])
		}
		next[p]++
	}
}

package host_test

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"sync"
	"testing"

	"github.com/kvtier/kvtier/host"
	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/host/stack"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// scriptedAcks is a Pool and a Store whose acks the fuzzer writes:
// batches get ids, acks are whatever the input says (wrong batches,
// indexes out of range, duplicates, stages out of order).
type scriptedAcks struct {
	mu    sync.Mutex
	next  tiers.BatchID
	sizes map[tiers.BatchID]int
	queue []tiers.Ack
	ready chan struct{}
	// longest and getErr are the store's answers; the Node's store
	// worker reads them while the test changes them (under mu).
	longest int
	getErr  error
}

func newScripted() *scriptedAcks {
	return &scriptedAcks{sizes: map[tiers.BatchID]int{}, ready: make(chan struct{}, 1)}
}

func (s *scriptedAcks) batch(n int) tiers.BatchID {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	s.sizes[s.next] = n
	return s.next
}

func (s *scriptedAcks) push(a tiers.Ack) {
	s.mu.Lock()
	s.queue = append(s.queue, a)
	s.mu.Unlock()
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

func (s *scriptedAcks) DrainAcks(dst []tiers.Ack) []tiers.Ack {
	s.mu.Lock()
	defer s.mu.Unlock()
	dst = append(dst, s.queue...)
	s.queue = s.queue[:0]
	return dst
}
func (s *scriptedAcks) AckReady() <-chan struct{} { return s.ready }
func (s *scriptedAcks) Close() error              { return nil }

type scriptedPool struct {
	*scriptedAcks
	geo tiers.PoolGeometry
}

func (p scriptedPool) Geometry() tiers.PoolGeometry { return p.geo }
func (p scriptedPool) CopyToSlab(_ context.Context, b []tiers.PoolCopy) (tiers.BatchID, error) {
	return p.batch(len(b)), nil
}
func (p scriptedPool) CopyFromSlab(_ context.Context, b []tiers.PoolCopy) (tiers.BatchID, error) {
	return p.batch(len(b)), nil
}
func (p scriptedPool) Stats() tiers.PoolStats { return tiers.PoolStats{} }

type scriptedStore struct{ *scriptedAcks }

func (s scriptedStore) Put(_ context.Context, b []tiers.PutRequest) (tiers.BatchID, error) {
	return s.batch(len(b)), nil
}
func (s scriptedStore) Get(_ context.Context, b []tiers.GetRequest, res []error) error {
	s.mu.Lock()
	e := s.getErr
	s.mu.Unlock()
	for i := range res {
		res[i] = e
	}
	return nil
}
func (s scriptedStore) LongestPrefix(_ context.Context, _ tiers.PayloadKind, chain []pagehash.Hash) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return min(s.longest, len(chain)), nil
}
func (s scriptedStore) Delete(context.Context, []tiers.Key) error { return nil }
func (s scriptedStore) Touch(context.Context, []tiers.Key) error  { return nil }
func (s scriptedStore) Stats() tiers.StoreStats                   { return tiers.StoreStats{} }

// FuzzNodeAcks feeds a Node engine events, ticks and arbitrary acks from
// its tiers (unknown batches, indexes out of range, duplicates, a durable
// before a gathered, failures): it never panics, never hangs, and the
// Machine's invariants hold after every tick.
func FuzzNodeAcks(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{0, 0, 3, 3, 1, 1, 3, 3, 0, 2, 4, 4, 4, 4, 3, 3, 2, 2, 0, 7, 5, 5, 6})
	f.Fuzz(fuzzNode)
}

func fuzzNode(t *testing.T, in []byte) {
	{
		if len(in) > 512 {
			in = in[:512]
		}
		st := &config.Stack{Payload: tiers.PayloadGeometry{PageTokens: 16, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: 4096}}}}
		acks := newScripted()
		s := &stack.Stack{
			Config: st,
			Slab:   tiertest.NewHeapSlab(64 * 4096),
			Pool:   scriptedPool{scriptedAcks: acks, geo: tiers.PoolGeometry{Pages: 8, Payload: st.Payload, Device: "fuzz"}},
			Stores: []stack.Store{{Name: "l3", Store: scriptedStore{acks}}},
		}
		o := control.DefaultOptions()
		o.Logger = slog.New(slog.DiscardHandler)
		mo, err := host.MachineOptions(s, o, "")
		if err != nil {
			t.Fatal(err)
		}
		m, err := control.New(mo)
		if err != nil {
			t.Fatal(err)
		}
		n, err := host.New(s, m, host.Options{SettleTimeout: 1})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		var req control.ReqID
		for i := 0; i+1 < len(in); i += 2 {
			op, arg := in[i]%8, in[i+1]
			switch op {
			case 0, 1: // a request's match or insert of a key of 1..4 pages
				req++
				k := make([]pagehash.Hash, 1+int(arg%4))
				for j := range k {
					binary.LittleEndian.PutUint64(k[j][:], uint64(arg/4)<<8|uint64(j))
				}
				kind := control.EvMatch
				if op == 1 {
					kind = control.EvInsert
				}
				_, err := n.Apply(ctx, control.Event{Kind: kind, Req: req, Pages: len(k), Hashes: k})
				var ee *control.EventError
				if err != nil && !errors.As(err, &ee) {
					t.Fatalf("apply: %v", err)
				}
			case 2, 3, 4: // an ack of some batch
				acks.push(tiers.Ack{Batch: tiers.BatchID(arg % 16), Index: int(arg/16) - 2, Stage: tiers.AckStage(1 + (arg+op)%4)})
			case 5: // a tick
				if _, err := n.Tick(ctx); err != nil {
					t.Fatalf("tick: %v", err)
				}
				if err := m.CheckInvariants(); err != nil {
					t.Fatal(err)
				}
			case 6: // the store's answers change
				acks.mu.Lock()
				acks.longest = int(arg % 5)
				if arg%2 == 0 {
					acks.getErr = tiers.ErrMiss
				} else {
					acks.getErr = nil
				}
				acks.mu.Unlock()
			case 7: // finish and release the latest request
				if req > 0 {
					_, _ = n.Apply(ctx, control.Event{Kind: control.EvFinish, Req: req})
					_, _ = n.Apply(ctx, control.Event{Kind: control.EvRelease, Req: req})
				}
			}
		}
		// Whatever is still outstanding times out into failed ops.
		if err := n.Settle(ctx); err != nil {
			t.Fatal(err)
		}
		if n.Outstanding() != 0 {
			t.Fatalf("%d batches outstanding after settle", n.Outstanding())
		}
		if _, err := n.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

package belady

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/lru"
	"github.com/kvtier/kvtier/policy/policytest"
)

// hashFuture is a fixed future for tests: page hash first byte -> next use.
type hashFuture map[byte]uint64

func (f hashFuture) NextUse(h pagehash.Hash, now uint64) (uint64, bool) {
	at, ok := f[h[0]]
	if !ok || at <= now {
		return 0, false
	}
	return at, true
}

func TestConformance(t *testing.T) {
	fut := hashFuture{}
	for i := 0; i < 256; i++ {
		fut[byte(i)] = uint64(1000 + (i*37)%256)
	}
	policytest.Run(t, func() (policy.Evictor, error) { return New(policy.Options{Future: fut}) })
}

func TestRefusesWithoutFuture(t *testing.T) {
	_, err := New(policy.Options{})
	if !errors.Is(err, ErrOffline) {
		t.Fatalf("New without Future: %v, want ErrOffline", err)
	}
	if !strings.Contains(err.Error(), "belady") || !strings.Contains(err.Error(), "replay only") {
		t.Fatalf("error %q does not name the policy and say replay only", err)
	}
}

func TestOrder(t *testing.T) {
	fut := hashFuture{1: 50, 2: 90, 3: 70}
	b, err := New(policy.Options{Future: fut})
	if err != nil {
		t.Fatal(err)
	}
	for id := policy.NodeID(1); id <= 5; id++ {
		var h pagehash.Hash
		h[0] = byte(id) // 4 and 5 are never used again
		b.Insert(policy.NodeInfo{ID: id, Time: 10, Tail: h})
		b.SetEvictable(id, true)
	}
	want := []policy.NodeID{4, 5, 2, 3, 1}
	for i, w := range want {
		v, ok := b.Victim()
		if !ok || v != w {
			t.Fatalf("victim %d = %d, want %d", i, v, w)
		}
		b.Remove(v)
	}
}

// TestBeatsLRUOnTrace checks the oracle beats lru and reproduces the
// independent simulator's Belady figures (1M tokens 37.73%, 3M tokens
// 55.96%) within 0.1 points on the shared trace.
func TestBeatsLRUOnTrace(t *testing.T) {
	reqs := policytest.SharedTrace(t, "mooncake_synthetic_trace.jsonl")
	fut := policytest.NewFuture(reqs)
	for _, tc := range []struct {
		capacity int
		want     float64
	}{{1_000_000 / 512, 0.3773}, {3_000_000 / 512, 0.5596}} {
		capacity := tc.capacity
		b, _ := New(policy.Options{Future: fut})
		l, _ := lru.New(policy.Options{})
		rb, err := policytest.Simulate(b, reqs, capacity)
		if err != nil {
			t.Fatal(err)
		}
		rl, err := policytest.Simulate(l, reqs, capacity)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("capacity %d blocks: belady %.4f lru %.4f", capacity, rb.HitRate(), rl.HitRate())
		if rb.HitRate() <= rl.HitRate() {
			t.Errorf("capacity %d: belady %.4f not above lru %.4f", capacity, rb.HitRate(), rl.HitRate())
		}
		if math.Abs(rb.HitRate()-tc.want) > 0.001 {
			t.Errorf("capacity %d: belady %.4f, want %.4f", capacity, rb.HitRate(), tc.want)
		}
	}
}

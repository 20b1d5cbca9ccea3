package lru

import (
	"testing"

	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/policytest"
)

func TestConformance(t *testing.T) {
	policytest.Run(t, func() (policy.Evictor, error) { return New(policy.Options{}) })
}

// event is one step of an order scenario.
type event struct {
	op   string // insert, hit, evictable, unevictable, remove
	id   policy.NodeID
	time uint64
}

func apply(ev policy.Evictor, es []event) {
	for _, e := range es {
		info := policy.NodeInfo{ID: e.id, Time: e.time, LastAccess: e.time, Pages: 1}
		switch e.op {
		case "insert":
			ev.Insert(info)
		case "hit":
			info.Hits = 1
			ev.Hit(info)
		case "evictable":
			ev.SetEvictable(e.id, true)
		case "unevictable":
			ev.SetEvictable(e.id, false)
		case "remove":
			ev.Remove(e.id)
		}
	}
}

func TestOrder(t *testing.T) {
	tests := []struct {
		name   string
		events []event
		want   []policy.NodeID // victims in order, removing each
	}{
		{"oldest first", []event{{"insert", 1, 5}, {"insert", 2, 3}, {"insert", 3, 9}, {"evictable", 1, 0}, {"evictable", 2, 0}, {"evictable", 3, 0}}, []policy.NodeID{2, 1, 3}},
		{"ties by id", []event{{"insert", 9, 4}, {"insert", 4, 4}, {"insert", 6, 4}, {"evictable", 9, 0}, {"evictable", 6, 0}, {"evictable", 4, 0}}, []policy.NodeID{4, 6, 9}},
		{"hit refreshes", []event{{"insert", 1, 1}, {"insert", 2, 2}, {"evictable", 1, 0}, {"evictable", 2, 0}, {"hit", 1, 3}}, []policy.NodeID{2, 1}},
		// A parent that becomes evictable after its child left is ordered
		// by its old access, before newer leaves (not appended at the tail).
		{"old parent becomes candidate", []event{{"insert", 1, 1}, {"insert", 2, 5}, {"insert", 3, 6}, {"evictable", 3, 0}, {"evictable", 2, 0}, {"remove", 2, 0}, {"evictable", 1, 0}}, []policy.NodeID{1, 3}},
		{"unevictable skipped", []event{{"insert", 1, 1}, {"insert", 2, 2}, {"evictable", 1, 0}, {"evictable", 2, 0}, {"unevictable", 1, 0}}, []policy.NodeID{2}},
		{"hit while not evictable kept", []event{{"insert", 1, 1}, {"insert", 2, 2}, {"hit", 1, 7}, {"evictable", 1, 0}, {"evictable", 2, 0}}, []policy.NodeID{2, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := New(policy.Options{})
			if err != nil {
				t.Fatal(err)
			}
			apply(l, tc.events)
			var got []policy.NodeID
			for {
				v, ok := l.Victim()
				if !ok {
					break
				}
				got = append(got, v)
				l.Remove(v)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("victims %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("victims %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestUnknownParam(t *testing.T) {
	if _, err := New(policy.Options{Params: map[string]float64{"x": 1}}); err == nil {
		t.Fatal("lru accepted an unknown parameter")
	}
}

func TestRegister(t *testing.T) {
	r := policy.NewRegistry()
	if err := Register(r); err != nil {
		t.Fatal(err)
	}
	reg, err := r.Lookup(policy.EvictorV1, Name)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := reg.Factory(policy.Options{})
	if err != nil || ev.Name() != Name {
		t.Fatalf("factory: %v, %v", ev, err)
	}
	if err := Register(r); err == nil {
		t.Fatal("second registration accepted")
	}
}

func BenchmarkChurn(b *testing.B) {
	l, _ := New(policy.Options{})
	const live = 6000
	next := policy.NodeID(1)
	for ; next <= live; next++ {
		l.Insert(policy.NodeInfo{ID: next, LastAccess: uint64(next)})
		l.SetEvictable(next, true)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		v, _ := l.Victim()
		l.Remove(v)
		l.Insert(policy.NodeInfo{ID: next, LastAccess: uint64(next)})
		l.SetEvictable(next, true)
		if i%2 == 0 {
			l.Hit(policy.NodeInfo{ID: next - 100, Time: uint64(next)})
		}
		next++
	}
}

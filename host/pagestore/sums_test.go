package pagestore

import (
	"context"

	"fmt"
	"sync"
	"testing"

	pb "github.com/kvtier/kvtier/api/storev1"
	"github.com/kvtier/kvtier/internal/crc32c"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

// lazyStore is a fake Store v1 that gathers its puts only once hold is
// released (a store slow to read the slab), and that keeps the put's
// sums as given when keeps is set (a tiers.SumKeeper) or computes its own
// over what it gathered (a store that predates sums, a plugin). Every Get
// verifies: a stored page whose bytes fail its checksum is a miss.
type lazyStore struct {
	keeps bool
	slab  tiers.Slab // set before the first Put

	mu      sync.Mutex
	held    bool
	pending []lazyPut
	pages   map[tiers.Key]lazyPage
	nextID  tiers.BatchID
	acks    []tiers.Ack
	ready   chan struct{}
	corrupt int // gets refused for a failed checksum
}

type lazyPut struct {
	id  tiers.BatchID
	i   int
	req tiers.PutRequest
}

type lazyPage struct {
	data []byte
	sum  uint32
}

func newLazyStore(keeps bool) *lazyStore {
	return &lazyStore{keeps: keeps, held: true, pages: map[tiers.Key]lazyPage{}, ready: make(chan struct{}, 1)}
}

// KeepsPutSums implements tiers.SumKeeper.
func (s *lazyStore) KeepsPutSums() bool { return s.keeps }

// release gathers every held put and every later one at once.
func (s *lazyStore) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = false
	for _, p := range s.pending {
		s.gather(p)
	}
	s.pending = nil
}

// gather copies one put's bytes out of the slab, under mu.
func (s *lazyStore) gather(p lazyPut) {
	src, err := s.slab.Bytes(p.req.Src)
	if err != nil {
		s.acks = append(s.acks, tiers.Ack{Batch: p.id, Index: p.i, Stage: tiers.AckFailed, Err: err})
	} else {
		pg := lazyPage{data: append([]byte(nil), src...), sum: p.req.Sum}
		if !s.keeps || !p.req.HasSum {
			pg.sum = crc32c.Checksum(pg.data)
		}
		s.pages[p.req.Key] = pg
		s.acks = append(s.acks, tiers.Ack{Batch: p.id, Index: p.i, Stage: tiers.AckGathered}, tiers.Ack{Batch: p.id, Index: p.i, Stage: tiers.AckDurable})
	}
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

func (s *lazyStore) Put(_ context.Context, batch []tiers.PutRequest) (tiers.BatchID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID++
	for i, r := range batch {
		p := lazyPut{id: s.nextID, i: i, req: r}
		if s.held {
			s.pending = append(s.pending, p)
		} else {
			s.gather(p)
		}
	}
	return s.nextID, nil
}

func (s *lazyStore) Get(_ context.Context, batch []tiers.GetRequest, results []error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range batch {
		pg, ok := s.pages[r.Key]
		switch {
		case !ok:
			results[i] = fmt.Errorf("lazy %s: %w", r.Key, tiers.ErrMiss)
		case crc32c.Checksum(pg.data) != pg.sum:
			s.corrupt++
			results[i] = fmt.Errorf("lazy %s: checksum: %w", r.Key, tiers.ErrMiss)
		default:
			dst, err := s.slab.Bytes(r.Dst)
			if err != nil {
				return err
			}
			copy(dst, pg.data)
			results[i] = nil
		}
	}
	return nil
}

func (s *lazyStore) LongestPrefix(_ context.Context, kind tiers.PayloadKind, chain []pagehash.Hash) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, h := range chain {
		if _, ok := s.pages[tiers.Key{Hash: h, Kind: kind}]; !ok {
			return i, nil
		}
	}
	return len(chain), nil
}

func (s *lazyStore) Delete(_ context.Context, keys []tiers.Key) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		delete(s.pages, k)
	}
	return nil
}

func (s *lazyStore) Touch(context.Context, []tiers.Key) error { return nil }

func (s *lazyStore) DrainAcks(dst []tiers.Ack) []tiers.Ack {
	s.mu.Lock()
	defer s.mu.Unlock()
	dst = append(dst, s.acks...)
	s.acks = nil
	return dst
}

func (s *lazyStore) AckReady() <-chan struct{} { return s.ready }
func (s *lazyStore) Stats() tiers.StoreStats   { return tiers.StoreStats{} }
func (s *lazyStore) Close() error              { return nil }

// TestScribbleBeforeGatherWithSums: a committed page whose slab bytes a
// client changes after Commit (which took its checksum) but before the
// store gathered it never comes back with those bytes. A store that keeps
// the put's sums stores the changed bytes under Commit's checksum, so the
// door skips its own check at the gather and the page, once evicted from
// the slab, reloads from the store as a miss; a store that computes its
// own sums gets the door's check at the gather, which drops the page and
// deletes it from the store. Either way: a miss, 0 wrong bytes (h.get
// compares every hit's bytes).
func TestScribbleBeforeGatherWithSums(t *testing.T) {
	cases := []struct {
		name  string
		keeps bool
		// wantDoorCorrupt is the door's corrupt count once the store
		// gathered; wantStoreCorrupt whether the store refused the page
		// at a reload.
		wantDoorCorrupt  uint64
		wantStoreCorrupt bool
	}{
		{name: "store keeps the sums", keeps: true, wantDoorCorrupt: 0, wantStoreCorrupt: true},
		{name: "store computes its own", keeps: false, wantDoorCorrupt: 1, wantStoreCorrupt: false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ls := newLazyStore(c.keeps)
			h := newHarness(t, 8, false, func(tiers.Store) tiers.Store { return ls }, Limits{})
			ls.mu.Lock()
			ls.slab = h.slab
			ls.mu.Unlock()
			if h.d.storeKeepsSums != c.keeps {
				t.Fatalf("door: store keeps sums %t, want %t", h.d.storeKeepsSums, c.keeps)
			}
			ses := h.register(t)
			h.set(t, ses, "a", "b") // Commit's checksums taken; the store holds the puts
			h.d.mu.Lock()
			k, _ := pageKey(h.d.sessions[ses].ns.id, 0, "a", nil)
			slot := h.d.entries[k].slot
			h.d.mu.Unlock()
			h.d.view(slot, 1)[11] ^= 0x04 // a client writes after Commit, before the gather
			ls.release()
			waitEvictable(t, h.d)
			if got := h.d.Snapshot().GetCorruptPages(); got != c.wantDoorCorrupt {
				t.Fatalf("door corrupt pages %d after the gather, want %d", got, c.wantDoorCorrupt)
			}
			// Push a and b out of the slab (8 slots): later gets reload
			// them from the store.
			h.setPast(t, ses, "x", 16)
			h.d.mu.Lock()
			_, inSlab := h.d.entries[k]
			h.d.mu.Unlock()
			if inSlab {
				t.Fatal("a still in the slab after 16 more pages in 8 slots")
			}
			got := h.get(t, ses, 1000, "a")
			if got[0] != pb.GetStatus_GET_STATUS_MISS {
				t.Fatalf("get a: %v, want a miss", got[0])
			}
			got = h.get(t, ses, 1000, "b")
			if got[0] != pb.GetStatus_GET_STATUS_HIT {
				t.Fatalf("get b: %v, want a hit (reloaded whole)", got[0])
			}
			ls.mu.Lock()
			storeCorrupt := ls.corrupt > 0
			ls.mu.Unlock()
			if storeCorrupt != c.wantStoreCorrupt {
				t.Fatalf("store refused a for its checksum: %t, want %t", storeCorrupt, c.wantStoreCorrupt)
			}
			// The store's refused copy is gone: a set of a stores it
			// again, and a get of it hits.
			if st := h.set(t, ses, "a"); st[0] != pb.SetStatus_SET_STATUS_RESERVED {
				t.Fatalf("set a again: %v, want RESERVED (the bad copy forgotten)", st[0])
			}
			waitEvictable(t, h.d)
			if got := h.get(t, ses, 1000, "a"); got[0] != pb.GetStatus_GET_STATUS_HIT {
				t.Fatalf("get a after it was set again: %v, want a hit", got[0])
			}
			if err := h.d.check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

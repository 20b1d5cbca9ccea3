package l3disk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// TestStress runs seeded random puts, gets, deletes and touches from
// several goroutines against a store small enough that garbage collection
// runs all the time, with one goroutine draining acks. Every hit must be
// byte-exact; at the end the pools, the index and the files must agree.
func TestStress(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	for _, ix := range testIndexes() {
		t.Run(ix.name, func(t *testing.T) {
			r := newRig(t, ix, 24)
			r.cfg.GCBatch = 3
			const workers, per, keysN = 4, 12, 80
			r.slab = tiertest.NewHeapSlab(int64(workers*2*per) * r.pageSlot())
			st := r.open(tiers.ColdStartClear)
			stop := make(chan struct{})
			var drainWG sync.WaitGroup
			var mu sync.Mutex
			ungathered := map[tiers.BatchID]int{} // items whose source is still in use
			type item struct {
				b tiers.BatchID
				i int
			}
			released := map[item]bool{}
			drainWG.Add(1)
			go func() {
				defer drainWG.Done()
				for {
					acks := st.DrainAcks(nil)
					mu.Lock()
					for _, a := range acks {
						// NB: a failed item may come without a gathered ack;
						// it releases its source all the same.
						it := item{a.Batch, a.Index}
						if (a.Stage == tiers.AckGathered || a.Stage == tiers.AckFailed) && !released[it] {
							released[it] = true
							ungathered[a.Batch]--
						}
					}
					mu.Unlock()
					select {
					case <-stop:
						return
					case <-st.AckReady():
					case <-time.After(time.Millisecond):
					}
				}
			}()
			key := func(i int) tiers.Key { return crashKey(i, tiers.PayloadKind(i%2)) }
			content := func(k tiers.Key) []byte { return crashContent(k, r.geom.Kinds[k.Kind].PageBytes) }
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(seed, uint64(w)))
					ctx := context.Background()
					base := w * 2 * per
					for step := range 150 {
						n := 1 + rng.IntN(per)
						keys := make([]tiers.Key, n)
						for i := range keys {
							keys[i] = key(rng.IntN(keysN))
						}
						switch op := rng.IntN(8); {
						case op < 3:
							// NB: a source span is rewritten only by this worker, and
							// only after its batch is gathered: wait for it here.
							reqs := make([]tiers.PutRequest, 0, n)
							seen := map[tiers.Key]bool{}
							for i, k := range keys {
								if seen[k] {
									continue
								}
								seen[k] = true
								sp := r.span(base+i, k.Kind)
								b, _ := r.slab.Bytes(sp)
								copy(b, content(k))
								reqs = append(reqs, tiers.PutRequest{Key: k, Src: sp})
							}
							mu.Lock()
							id, err := st.Put(ctx, reqs)
							if err != nil {
								mu.Unlock()
								errs <- fmt.Errorf("worker %d step %d put: %w", w, step, err)
								return
							}
							ungathered[id] += len(reqs)
							mu.Unlock()
							// The sources are reused by this worker's next put:
							// wait until the store has copied them.
							for deadline := time.Now().Add(20 * time.Second); ; {
								mu.Lock()
								left := ungathered[id]
								mu.Unlock()
								if left <= 0 {
									break
								}
								if time.Now().After(deadline) {
									errs <- fmt.Errorf("worker %d: batch %d not gathered in 20s", w, id)
									return
								}
								time.Sleep(200 * time.Microsecond)
							}
						case op < 6:
							reqs := make([]tiers.GetRequest, n)
							for i, k := range keys {
								reqs[i] = tiers.GetRequest{Key: k, Dst: r.span(base+per+i, k.Kind)}
							}
							res := make([]error, n)
							if err := st.Get(ctx, reqs, res); err != nil {
								errs <- fmt.Errorf("worker %d step %d get: %w", w, step, err)
								return
							}
							for i, k := range keys {
								if res[i] == nil {
									got, _ := r.slab.Bytes(reqs[i].Dst)
									if !bytes.Equal(got, content(k)) {
										errs <- fmt.Errorf("worker %d step %d: %s hit with WRONG BYTES", w, step, k)
										return
									}
								} else if !errors.Is(res[i], tiers.ErrMiss) {
									errs <- fmt.Errorf("worker %d: get result %v is not a miss", w, res[i])
									return
								}
							}
						case op == 6:
							if err := st.Delete(ctx, keys); err != nil {
								errs <- fmt.Errorf("worker %d delete: %w", w, err)
								return
							}
						default:
							if err := st.Touch(ctx, keys); err != nil {
								errs <- fmt.Errorf("worker %d touch: %w", w, err)
								return
							}
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			r.checkConsistent()
			close(stop)
			drainWG.Wait()
			if s := st.Stats(); s.Evictions == 0 || s.Hits == 0 {
				t.Fatalf("stress did not exercise GC and hits: %+v", s)
			}
		})
	}
}

package pluginhost

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/badger"
	"github.com/kvtier/kvtier/indexes/indextest"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/memstore"
)

// TestIndexMetamorphic: one seeded operation stream on the in-process
// badger index and on the badger plugin gives the same answers.
func TestIndexMetamorphic(t *testing.T) {
	path, sum := pluginBinary(t, "plugins/examples/badger")
	ctx := context.Background()
	env := indexes.Env{Logger: testLogger(t, nil), Dir: t.TempDir()}
	cfg := badger.DefaultConfig()
	cfg.Sync = false
	in, err := badger.Open(ctx, env, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	pl, err := OpenIndex(ctx, indexes.Env{Logger: testLogger(t, nil), Dir: t.TempDir()}, PluginSpec{
		Name: "metamorphic", Path: path, SHA256: sum, Options: fastOptions(), Config: map[string]any{"sync": false},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	indextest.Metamorphic(t, 0x706c7567, 400, in, pl)
}

// TestStoreMetamorphic: one seeded stream of puts, gets, prefix probes,
// deletes and touches on an in-process memstore and on the memstore plugin,
// each over its own slab, gives the same hits, bytes, prefixes and stats.
// The stores are small, so LRU eviction is part of what must agree.
func TestStoreMetamorphic(t *testing.T) {
	const seed = 0x6d656d
	path, sum := pluginBinary(t, "plugins/examples/memstore")
	ctx := context.Background()
	const capPages = 24
	slabA, slabB := newSlab(t, 64*slot), newSlab(t, 64*slot)
	in, err := memstore.Open(storeEnv(t, slabA, nil), memstore.Config{Capacity: quantity.Size(capPages * slot)})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	pl, err := OpenStore(ctx, storeEnv(t, slabB, nil), PluginSpec{
		Name: "metamorphic", Path: path, SHA256: sum, Options: fastOptions(),
		Config: map[string]any{"capacity": capPages * slot},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	if err := storeMetamorphic(ctx, seed, 300, in, slabA, pl, slabB); err != nil {
		t.Fatalf("seed %#x: %v", seed, err)
	}
}

func storeMetamorphic(ctx context.Context, seed uint64, steps int, a tiers.Store, sa tiers.Slab, b tiers.Store, sb tiers.Slab) error {
	rng := rand.New(rand.NewPCG(seed, seed))
	// A pool of 60 pages in 6 chains of 10, so prefixes are meaningful.
	type pg struct {
		key  tiers.Key
		data []byte
	}
	var pool []pg
	var chains [][]pagehash.Hash
	for c := range 6 {
		prev := pagehash.Root
		var chain []pagehash.Hash
		for i := range 10 {
			prev = pagehash.Next(prev, []uint32{uint32(c), uint32(i)})
			chain = append(chain, prev)
			data := make([]byte, slot)
			for j := range data {
				data[j] = byte(rng.Uint32())
			}
			pool = append(pool, pg{key: tiers.Key{Hash: prev}, data: data})
		}
		chains = append(chains, chain)
	}
	span := func(i int) tiers.Span { return tiers.Span{Offset: int64(i) * slot, Length: slot} }
	pick := func(n int) []int {
		idx := make([]int, n)
		for i := range idx {
			idx[i] = rng.IntN(len(pool))
		}
		return idx
	}
	waitTerminal := func(st tiers.Store, id tiers.BatchID, n int) ([]bool, error) {
		durable := make([]bool, n)
		deadline := time.Now().Add(10 * time.Second)
		for left := n; left > 0; {
			for _, ack := range st.DrainAcks(nil) {
				if ack.Batch != id || ack.Stage == tiers.AckGathered {
					continue
				}
				durable[ack.Index] = ack.Stage == tiers.AckDurable
				left--
			}
			if left == 0 {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("batch %d: acks timed out", id)
			}
			select {
			case <-st.AckReady():
			case <-time.After(5 * time.Millisecond):
			}
		}
		return durable, nil
	}
	for step := range steps {
		switch op := rng.IntN(10); {
		case op < 4: // put a batch
			idx := pick(1 + rng.IntN(8))
			reqs := make([]tiers.PutRequest, len(idx))
			for i, p := range idx {
				for _, s := range []tiers.Slab{sa, sb} {
					buf, _ := s.Bytes(span(i))
					copy(buf, pool[p].data)
				}
				reqs[i] = tiers.PutRequest{Key: pool[p].key, Src: span(i)}
			}
			var got [2][]bool
			for k, st := range []tiers.Store{a, b} {
				id, err := st.Put(ctx, reqs)
				if err != nil {
					return fmt.Errorf("step %d put: %w", step, err)
				}
				if got[k], err = waitTerminal(st, id, len(reqs)); err != nil {
					return fmt.Errorf("step %d: %w", step, err)
				}
			}
			if fmt.Sprint(got[0]) != fmt.Sprint(got[1]) {
				return fmt.Errorf("step %d put: durable %v in process, %v via plugin", step, got[0], got[1])
			}
		case op < 7: // get a batch into slots 32..
			idx := pick(1 + rng.IntN(8))
			reqs := make([]tiers.GetRequest, len(idx))
			for i, p := range idx {
				reqs[i] = tiers.GetRequest{Key: pool[p].key, Dst: span(32 + i)}
			}
			var hits [2][]bool
			for k, pair := range []struct {
				st tiers.Store
				sl tiers.Slab
			}{{a, sa}, {b, sb}} {
				res := make([]error, len(reqs))
				if err := pair.st.Get(ctx, reqs, res); err != nil {
					return fmt.Errorf("step %d get: %w", step, err)
				}
				for i, r := range res {
					if r != nil && !errors.Is(r, tiers.ErrMiss) {
						return fmt.Errorf("step %d get item %d: %w", step, i, r)
					}
					if r == nil {
						buf, _ := pair.sl.Bytes(span(32 + i))
						if !bytes.Equal(buf, pool[idx[i]].data) {
							return fmt.Errorf("step %d get item %d: hit with wrong bytes (side %d)", step, i, k)
						}
					}
					hits[k] = append(hits[k], r == nil)
				}
			}
			if fmt.Sprint(hits[0]) != fmt.Sprint(hits[1]) {
				return fmt.Errorf("step %d get: hits %v in process, %v via plugin", step, hits[0], hits[1])
			}
		case op < 8: // longest prefix
			chain := chains[rng.IntN(len(chains))]
			na, err := a.LongestPrefix(ctx, 0, chain)
			if err != nil {
				return err
			}
			nb, err := b.LongestPrefix(ctx, 0, chain)
			if err != nil {
				return err
			}
			if na != nb {
				return fmt.Errorf("step %d prefix: %d in process, %d via plugin", step, na, nb)
			}
		case op < 9: // delete
			keys := []tiers.Key{pool[pick(1)[0]].key}
			if err := errors.Join(a.Delete(ctx, keys), b.Delete(ctx, keys)); err != nil {
				return fmt.Errorf("step %d delete: %w", step, err)
			}
		default: // touch
			keys := []tiers.Key{pool[pick(1)[0]].key, pool[pick(1)[0]].key}
			if err := errors.Join(a.Touch(ctx, keys), b.Touch(ctx, keys)); err != nil {
				return fmt.Errorf("step %d touch: %w", step, err)
			}
		}
	}
	x, y := a.Stats(), b.Stats()
	if x != y {
		return fmt.Errorf("stats after %d steps: %+v in process, %+v via plugin", steps, x, y)
	}
	return nil
}

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/kvtier/kvtier/internal/slabfile"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/plugins/pluginhost"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/redis"
	"github.com/kvtier/kvtier/tiers/redis/redistest"
)

// TestMetamorphic: one seeded stream of puts, gets, prefix probes, deletes
// and touches on the in-process store and on the plugin, each under its own
// key prefix on the same server, gives the same hits, bytes and prefixes.
func TestMetamorphic(t *testing.T) {
	redistest.RequireBinaries(t)
	t.Parallel()
	const seed = 0x7265_6d65
	t.Logf("seed %#x", seed)
	path, sum := buildPlugin(t)
	srv := redistest.StandaloneT(t, redistest.Options{})
	ctx := context.Background()
	g := payload()
	slot := g.Kinds[0].PageBytes
	newSlab := func() tiers.Slab {
		dir := "/dev/shm"
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			dir = t.TempDir()
		}
		s, err := slabfile.Open(ctx, nil, dir, "redis-metamorphic", 64*slot, false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	env := func(s tiers.Slab) tiers.Env {
		return tiers.Env{Logger: logger(), Payload: g, WorldSize: 1, StackID: "redis-metamorphic", Slab: s, ColdStart: tiers.ColdStartLoad}
	}
	sa, sb := newSlab(), newSlab()
	cfg := redis.DefaultConfig()
	cfg.Mode, cfg.Addresses, cfg.KeyPrefix = redis.ModeStandalone, []string{srv.Addr()}, "meta-in:"
	in, err := redis.Open(ctx, env(sa), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	pl, err := pluginhost.OpenStore(ctx, env(sb), pluginhost.PluginSpec{
		Name: "redis-metamorphic", Path: path, SHA256: sum,
		Config: map[string]any{"mode": "standalone", "addresses": cfg.Addresses, "key_prefix": "meta-plugin:"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	if err := metamorphic(ctx, seed, 200, slot, in, sa, pl, sb); err != nil {
		t.Fatalf("seed %#x: %v", seed, err)
	}
}

func metamorphic(ctx context.Context, seed uint64, steps int, slot int64, a tiers.Store, sa tiers.Slab, b tiers.Store, sb tiers.Slab) error {
	rng := rand.New(rand.NewPCG(seed, seed))
	// 40 pages in 4 chains of 10, so prefixes are meaningful.
	type pg struct {
		key  tiers.Key
		data []byte
	}
	var pool []pg
	var chains [][]pagehash.Hash
	for c := range 4 {
		prev := pagehash.Root
		var chain []pagehash.Hash
		for i := range 10 {
			prev = pagehash.Next(prev, []uint32{uint32(c), uint32(i), uint32(seed)})
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
	keysOf := func(idx []int) []tiers.Key {
		keys := make([]tiers.Key, len(idx))
		for i, p := range idx {
			keys[i] = pool[p].key
		}
		return keys
	}
	stores := []struct {
		st tiers.Store
		sl tiers.Slab
	}{{a, sa}, {b, sb}}
	for step := range steps {
		switch op := rng.IntN(10); {
		case op < 4: // put a batch
			idx := pick(1 + rng.IntN(8))
			reqs := make([]tiers.PutRequest, len(idx))
			for i, p := range idx {
				for _, s := range stores {
					buf, _ := s.sl.Bytes(span(i))
					copy(buf, pool[p].data)
				}
				reqs[i] = tiers.PutRequest{Key: pool[p].key, Src: span(i)}
			}
			var got [2][]bool
			for k, s := range stores {
				id, err := s.st.Put(ctx, reqs)
				if err != nil {
					return fmt.Errorf("step %d put: %w", step, err)
				}
				if got[k], err = terminal(s.st, id, len(reqs)); err != nil {
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
			for k, s := range stores {
				res := make([]error, len(reqs))
				if err := s.st.Get(ctx, reqs, res); err != nil {
					return fmt.Errorf("step %d get: %w", step, err)
				}
				for i, r := range res {
					if r != nil && !errors.Is(r, tiers.ErrMiss) {
						return fmt.Errorf("step %d get item %d: %w", step, i, r)
					}
					if buf, _ := s.sl.Bytes(span(32 + i)); r == nil && !bytes.Equal(buf, pool[idx[i]].data) {
						return fmt.Errorf("step %d get item %d: hit with wrong bytes (side %d)", step, i, k)
					}
					hits[k] = append(hits[k], r == nil)
				}
			}
			if fmt.Sprint(hits[0]) != fmt.Sprint(hits[1]) {
				return fmt.Errorf("step %d get: hits %v in process, %v via plugin", step, hits[0], hits[1])
			}
		case op < 8: // longest prefix
			chain := chains[rng.IntN(len(chains))]
			var n [2]int
			for k, s := range stores {
				var err error
				if n[k], err = s.st.LongestPrefix(ctx, 0, chain); err != nil {
					return fmt.Errorf("step %d prefix: %w", step, err)
				}
			}
			if n[0] != n[1] {
				return fmt.Errorf("step %d prefix: %d in process, %d via plugin", step, n[0], n[1])
			}
		case op < 9: // delete
			keys := keysOf(pick(1 + rng.IntN(3)))
			if err := errors.Join(a.Delete(ctx, keys), b.Delete(ctx, keys)); err != nil {
				return fmt.Errorf("step %d delete: %w", step, err)
			}
		default: // touch
			keys := keysOf(pick(1 + rng.IntN(4)))
			if err := errors.Join(a.Touch(ctx, keys), b.Touch(ctx, keys)); err != nil {
				return fmt.Errorf("step %d touch: %w", step, err)
			}
		}
	}
	sta, stb := a.Stats(), b.Stats()
	if sta.Hits != stb.Hits || sta.Misses != stb.Misses || sta.Puts != stb.Puts || sta.PutFailures != stb.PutFailures {
		return fmt.Errorf("stats differ: in process %+v, via plugin %+v", sta, stb)
	}
	return nil
}

// terminal waits for the n terminal acks of batch id and reports which
// items are durable.
func terminal(st tiers.Store, id tiers.BatchID, n int) ([]bool, error) {
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

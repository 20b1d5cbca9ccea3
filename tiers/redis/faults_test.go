package redis_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/redis"
	"github.com/kvtier/kvtier/tiers/redis/redistest"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// faultSeed seeds every fault test's page contents; the tests print it.
const faultSeed = 0x14_2026

// driver puts and gets pages of kind 0 through one store and checks every
// hit byte for byte. wrong counts hits whose bytes differ: it must stay 0.
type driver struct {
	t     testing.TB
	store *redis.Store
	slab  *tiertest.HeapSlab
	size  int64
	rng   *rand.Rand
	wrong atomic.Int64
	// maxWait is the longest a Get call or a put's terminal ack took.
	maxWait time.Duration
}

const driverSlots = 64

func newDriver(t testing.TB, cfg redis.Config, seed uint64) *driver {
	t.Helper()
	t.Logf("seed %#x", seed)
	g := geometry()
	slab := tiertest.NewHeapSlab(2 * driverSlots * g.Kinds[0].PageBytes)
	return &driver{t: t, store: openStore(t, cfg, slab), slab: slab, size: g.Kinds[0].PageBytes, rng: rand.New(rand.NewPCG(seed, 14))}
}

// pages returns n fresh keys of kind 0 (a chain from a random root).
func (d *driver) pages(n int) []tiers.Key {
	keys := make([]tiers.Key, n)
	prev := pagehash.Root
	root := d.rng.Uint32()
	for i := range keys {
		prev = pagehash.Next(prev, []uint32{root, uint32(i)})
		keys[i] = tiers.Key{Hash: prev, Kind: 0}
	}
	return keys
}

// content derives a page's bytes from its key.
func content(k tiers.Key, size int64) []byte {
	b := make([]byte, size)
	r := rand.New(rand.NewPCG(binary.LittleEndian.Uint64(k.Hash[:8]), uint64(k.Kind)))
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b
}

func (d *driver) span(slot int) tiers.Span {
	return tiers.Span{Offset: int64(slot) * d.size, Length: d.size}
}

// put stores keys (at most driverSlots) and returns each item's terminal
// error, failing the test if an ack does not come within limit.
func (d *driver) put(keys []tiers.Key, limit time.Duration) []error {
	d.t.Helper()
	reqs := make([]tiers.PutRequest, len(keys))
	for i, k := range keys {
		sp := d.span(i)
		b, _ := d.slab.Bytes(sp)
		copy(b, content(k, d.size))
		reqs[i] = tiers.PutRequest{Key: k, Src: sp}
	}
	start := time.Now()
	id, err := d.store.Put(context.Background(), reqs)
	if err != nil {
		d.t.Fatalf("put: %v", err)
	}
	errs := make([]error, len(keys))
	left := len(keys)
	deadline := time.Now().Add(limit)
	var buf []tiers.Ack
	for left > 0 {
		buf = d.store.DrainAcks(buf[:0])
		for _, a := range buf {
			if a.Batch != id {
				continue
			}
			switch a.Stage {
			case tiers.AckDurable:
				left--
			case tiers.AckFailed:
				errs[a.Index] = a.Err
				left--
			}
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("put of %d pages: %d items without a terminal ack after %v (a hang)", len(keys), left, limit)
		}
		select {
		case <-d.store.AckReady():
		case <-time.After(5 * time.Millisecond):
		}
	}
	d.maxWait = max(d.maxWait, time.Since(start))
	return errs
}

// get reads keys into the second half of the slab and returns per-item
// results, counting any hit with wrong bytes.
func (d *driver) get(keys []tiers.Key) []error {
	d.t.Helper()
	reqs := make([]tiers.GetRequest, len(keys))
	for i, k := range keys {
		sp := d.span(driverSlots + i)
		b, _ := d.slab.Bytes(sp)
		clear(b)
		reqs[i] = tiers.GetRequest{Key: k, Dst: sp}
	}
	res := make([]error, len(keys))
	start := time.Now()
	if err := d.store.Get(context.Background(), reqs, res); err != nil {
		d.t.Fatalf("get: %v", err)
	}
	d.maxWait = max(d.maxWait, time.Since(start))
	for i, k := range keys {
		if res[i] == nil {
			b, _ := d.slab.Bytes(reqs[i].Dst)
			if !bytes.Equal(b, content(k, d.size)) {
				d.wrong.Add(1)
				d.t.Errorf("get %s: hit with wrong bytes", k)
			}
		} else if !errors.Is(res[i], tiers.ErrMiss) {
			d.t.Errorf("get %s: %v does not wrap tiers.ErrMiss", k, res[i])
		}
	}
	return res
}

func count(errs []error) (ok, failed int) {
	for _, e := range errs {
		if e == nil {
			ok++
		} else {
			failed++
		}
	}
	return ok, failed
}

func (d *driver) checkNoWrongBytes() {
	d.t.Helper()
	if n := d.wrong.Load(); n != 0 {
		d.t.Fatalf("%d hits with wrong bytes", n)
	}
}

// TestServerDownAndBack kills a standalone server: puts fail and gets miss
// within the timeout, prefix probes answer 0; once the server is back on
// its port the same store serves again.
func TestServerDownAndBack(t *testing.T) {
	t.Parallel()
	srv := redistest.StandaloneT(t, redistest.Options{})
	cfg := baseConfig(redis.ModeStandalone, []string{srv.Addr()})
	cfg.KeyPrefix = uniquePrefix(t)
	cfg.Timeout = time.Second
	d := newDriver(t, cfg, faultSeed)
	keys := d.pages(16)
	if _, failed := count(d.put(keys, 5*time.Second)); failed != 0 {
		t.Fatalf("%d puts failed on a healthy server", failed)
	}
	if ok, _ := count(d.get(keys)); ok != len(keys) {
		t.Fatalf("%d of %d hits on a healthy server", ok, len(keys))
	}
	srv.Kill()
	before := d.store.Stats()
	d.maxWait = 0
	down := d.pages(8)
	if ok, _ := count(d.put(down, 3*cfg.Timeout)); ok != 0 {
		t.Fatalf("%d puts succeeded with the server down", ok)
	}
	if ok, _ := count(d.get(keys)); ok != 0 {
		t.Fatalf("%d hits with the server down", ok)
	}
	chain := make([]pagehash.Hash, len(keys))
	for i, k := range keys {
		chain[i] = k.Hash
	}
	if n, err := d.store.LongestPrefix(context.Background(), 0, chain); n != 0 || err != nil {
		t.Fatalf("longest prefix with the server down = %d, %v; want 0, nil", n, err)
	}
	if d.maxWait > cfg.Timeout+time.Second {
		t.Fatalf("an operation against the dead server took %v (timeout %v)", d.maxWait, cfg.Timeout)
	}
	after := d.store.Stats()
	if after.PutFailures-before.PutFailures != int64(len(down)) || after.Misses-before.Misses != int64(len(keys)) {
		t.Fatalf("stats do not show the outage: before %+v after %+v", before, after)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The server lost its memory; the store reconnects by itself.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, failed := count(d.put(down, 5*time.Second))
		if failed == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("store did not recover within 5s of the server's return: %d puts still fail", failed)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ok, _ := count(d.get(down)); ok != len(down) {
		t.Fatalf("%d of %d hits after recovery", ok, len(down))
	}
	d.checkNoWrongBytes()
	t.Logf("outage: %+v", d.store.Stats())
}

// TestMaxMemory fills a small server: with an evicting policy, old pages
// become misses and puts keep succeeding; with noeviction, puts fail with
// tiers.ErrFull. Either way no hit is wrong.
func TestMaxMemory(t *testing.T) {
	t.Parallel()
	const pages = 3 * driverSlots
	for _, tc := range []struct {
		policy    string
		wantFull  bool
		wantEvict bool
	}{
		{"allkeys-lru", false, true},
		{"allkeys-lfu", false, true},
		{"noeviction", true, false},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			// About 40-90 pages of 12 KiB above an empty server's 0.9-1.5
			// MiB (clients' buffers count too), so 192 pages overfill it.
			srv := redistest.StandaloneT(t, redistest.Options{MaxMemoryBytes: 3<<19 + 40*13<<10, Policy: tc.policy})
			cfg := baseConfig(redis.ModeStandalone, []string{srv.Addr()})
			cfg.KeyPrefix = uniquePrefix(t)
			d := newDriver(t, cfg, faultSeed+1)
			var all []tiers.Key
			full := 0
			for len(all) < pages {
				keys := d.pages(driverSlots / 2)
				for _, err := range d.put(keys, 10*time.Second) {
					if err != nil {
						if !errors.Is(err, tiers.ErrFull) {
							t.Fatalf("put into a full server: %v, want tiers.ErrFull", err)
						}
						full++
					}
				}
				all = append(all, keys...)
			}
			hits := 0
			for i := 0; i < len(all); i += driverSlots {
				ok, _ := count(d.get(all[i:min(len(all), i+driverSlots)]))
				hits += ok
			}
			cl := srv.Client()
			defer cl.Close()
			info, err := cl.Info(context.Background(), "stats").Result()
			if err != nil {
				t.Fatal(err)
			}
			evicted := infoInt(info, "evicted_keys")
			st := d.store.Stats()
			t.Logf("%s: %d pages put, %d failed full, %d hits, server evicted %d; stats %+v", tc.policy, len(all), full, hits, evicted, st)
			if tc.wantFull != (full > 0) || tc.wantEvict != (evicted > 0) {
				t.Fatalf("full puts %d, evicted %d: want full %v, evictions %v", full, evicted, tc.wantFull, tc.wantEvict)
			}
			if hits == 0 || hits >= len(all) {
				t.Fatalf("%d of %d pages hit after overfilling", hits, len(all))
			}
			// NB: a put refused half way (the SET as OOM, the APPEND not,
			// or the reverse) unlinks what it left: a plain miss.
			if st.PutFailures != int64(full) || st.Misses != int64(len(all)-hits) || st.Corrupt != 0 {
				t.Fatalf("stats %+v: want %d put failures, %d misses, none corrupt", st, full, len(all)-hits)
			}
			d.checkNoWrongBytes()
		})
	}
}

func infoInt(info, field string) int64 {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return -1
}

// redisKey is the key the store uses (see doc.go).
func redisKey(prefix string, k tiers.Key) string {
	return prefix + "p" + strconv.Itoa(int(k.Kind)) + ":" + k.Hash.String()
}

// TestCorruptValues damages stored values behind the store's back: each
// becomes a counted corrupt miss, never bytes.
func TestCorruptValues(t *testing.T) {
	t.Parallel()
	srv := redistest.StandaloneT(t, redistest.Options{})
	cfg := baseConfig(redis.ModeStandalone, []string{srv.Addr()})
	cfg.KeyPrefix = uniquePrefix(t)
	d := newDriver(t, cfg, faultSeed+2)
	cl := srv.Client()
	defer cl.Close()
	ctx := context.Background()
	keys := d.pages(2)
	victim, donor := keys[0], keys[1]
	key := redisKey(cfg.KeyPrefix, victim)
	for _, tc := range []struct {
		name   string
		damage func() error
	}{
		{"payload byte (SETRANGE)", func() error { return cl.SetRange(ctx, key, 777, "\xff\x00").Err() }},
		{"last payload byte (SETRANGE)", func() error { return cl.SetRange(ctx, key, d.size-1, "!").Err() }},
		{"trailer hash byte (SETRANGE)", func() error { return cl.SetRange(ctx, key, d.size+9, "\x00").Err() }},
		{"magic", func() error { return cl.SetRange(ctx, key, d.size, "XXXX").Err() }},
		{"foreign value (SET by someone else)", func() error { return cl.Set(ctx, key, "hello from another app", 0).Err() }},
		{"empty value", func() error { return cl.Set(ctx, key, "", 0).Err() }},
		{"another page's value", func() error {
			v, err := cl.Get(ctx, redisKey(cfg.KeyPrefix, donor)).Bytes()
			if err != nil {
				return err
			}
			return cl.Set(ctx, key, v, 0).Err()
		}},
		{"truncated", func() error {
			v, err := cl.Get(ctx, key).Bytes()
			if err != nil {
				return err
			}
			return cl.Set(ctx, key, v[:len(v)-1], 0).Err()
		}},
		{"appended", func() error { return cl.Append(ctx, key, "x").Err() }},
		{"a wrong kind's value", func() error {
			v, err := cl.Get(ctx, key).Bytes()
			if err != nil {
				return err
			}
			v = append([]byte(nil), v...)
			v[d.size+6] = 1
			if _, err := redis.DecodeTrailer(v); err == nil {
				t.Fatal("trailer with a changed kind decoded")
			}
			return cl.Set(ctx, key, v, 0).Err()
		}},
		{"the same page in format version 1 (an older kvtier)", func() error {
			v, err := cl.Get(ctx, key).Bytes()
			if err != nil {
				return err
			}
			old := redis.EncodeVersion1(make([]byte, len(v)), victim, v[:d.size])
			return cl.Set(ctx, key, old, 0).Err()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, failed := count(d.put(keys, 5*time.Second)); failed != 0 {
				t.Fatal("put failed")
			}
			if ok, _ := count(d.get(keys)); ok != 2 {
				t.Fatal("pages do not hit before damage")
			}
			// NB: the overwrite of an identical page is what a second
			// put does; delete first so the damage is not undone.
			if err := tc.damage(); err != nil {
				t.Fatal(err)
			}
			before := d.store.Stats()
			res := d.get(keys)
			if res[0] == nil || !errors.Is(res[0], redis.ErrBadValue) {
				t.Fatalf("damaged page: %v, want a miss wrapping ErrBadValue", res[0])
			}
			if res[1] != nil {
				t.Fatalf("undamaged page: %v", res[1])
			}
			after := d.store.Stats()
			if after.Corrupt-before.Corrupt != 1 || after.Misses-before.Misses != 1 {
				t.Fatalf("stats before %+v after %+v: want one more corrupt miss", before, after)
			}
		})
	}
	d.checkNoWrongBytes()
}

// TestClusterFaults runs the cluster's fault scenarios in order on one
// cluster of 3 masters and 3 replicas: a forced failover, then a master
// killed mid-run, then its return as a replica. Two stores share the
// cluster: "fast" acknowledges once the master has a page, "durable" waits
// for one replica (min_replicas 1).
func TestClusterFaults(t *testing.T) {
	t.Parallel()
	cl := redistest.ClusterT(t, 3, 1, redistest.Options{NodeTimeout: time.Second})
	ctx := context.Background()
	cfg := baseConfig(redis.ModeCluster, cl.Addrs())
	cfg.KeyPrefix = uniquePrefix(t)
	// NB: generous for a loaded 2-core machine running other tests
	// beside this one (and the race detector): a WAIT that misses its
	// deadline is a failed put, which the healthy phases do not expect.
	cfg.Timeout = 2 * time.Second
	cfg.ReplicaTimeout = time.Second
	fast := newDriver(t, cfg, faultSeed+3)
	cfg.MinReplicas = 1
	durable := newDriver(t, cfg, faultSeed+4)

	stored := durable.pages(48)
	if errs := durable.put(stored, 10*time.Second); firstErr(errs) != nil {
		t.Fatalf("puts failed on a healthy cluster: %v", firstErr(errs))
	}
	masterOf := func(k tiers.Key) *redistest.Node {
		// A fresh client: a long-lived one may hold a stale slot map.
		cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs(), Protocol: 2, DisableIdentity: true})
		defer cc.Close()
		m, err := cc.MasterForKey(ctx, redisKey(cfg.KeyPrefix, k))
		if err != nil {
			t.Fatal(err)
		}
		return cl.NodeByAddr(m.Options().Addr)
	}

	t.Run("forced failover", func(t *testing.T) {
		m := masterOf(stored[0])
		r := cl.ReplicaOf(ctx, m)
		if r == nil {
			t.Fatalf("master %s has no replica", m.Addr())
		}
		if err := cl.Failover(ctx, r, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		// Acknowledged with min_replicas 1, so the new master has them:
		// the store follows MOVED to it and every page hits.
		if ok, _ := count(durable.get(stored)); ok != len(stored) {
			t.Fatalf("%d of %d hits after a coordinated failover", ok, len(stored))
		}
		if err := cl.WaitHealthy(ctx, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		for _, d := range []*driver{fast, durable} {
			more := d.pages(16)
			if errs := d.put(more, 10*time.Second); firstErr(errs) != nil {
				t.Fatalf("puts failed after the failover: %v", firstErr(errs))
			}
			if ok, _ := count(d.get(more)); ok != len(more) {
				t.Fatalf("%d of %d hits after the failover", ok, len(more))
			}
		}
	})

	var killed *redistest.Node
	t.Run("master killed mid-run", func(t *testing.T) {
		before := fast.store.Stats()
		victim := masterOf(stored[0])
		replica := cl.ReplicaOf(ctx, victim)
		if replica == nil {
			t.Fatalf("master %s has no replica to fail over to", victim.Addr())
		}
		fast.maxWait, durable.maxWait = 0, 0
		var failedPuts, misses, notReplicated int
		recovered := time.Duration(0)
		start := time.Now()
		for round := 0; time.Since(start) < 15*time.Second; round++ {
			if round == 2 {
				victim.Kill()
				killed = victim
				start = time.Now()
				t.Logf("round %d: killed master %s (replica %s)", round, victim.Addr(), replica.Addr())
			}
			keys := fast.pages(16)
			_, f := count(fast.put(keys, 3*cfg.Timeout))
			failedPuts += f
			_, m := count(fast.get(stored))
			misses += m
			// The durable store's puts to the orphaned master cannot be
			// confirmed by a replica: failed, never acknowledged durable.
			for _, err := range durable.put(durable.pages(16), 3*cfg.Timeout) {
				if errors.Is(err, redis.ErrNotReplicated) {
					notReplicated++
				}
			}
			if round > 2 && f == 0 {
				if ok, _ := count(fast.get(keys)); ok == len(keys) {
					recovered = time.Since(start)
					t.Logf("round %d, %v after the kill: puts succeed and hit again", round, recovered.Round(time.Millisecond))
					break
				}
			}
		}
		if recovered == 0 {
			t.Fatal("store did not recover within 15s of the master's death")
		}
		after := fast.store.Stats()
		t.Logf("during the outage: %d failed puts, %d misses, %d durable puts not replicated; stats %+v; slowest call %v",
			failedPuts, misses, notReplicated, after, max(fast.maxWait, durable.maxWait))
		if failedPuts == 0 || misses == 0 {
			t.Fatalf("the dead master did not show as failed puts (%d) and misses (%d)", failedPuts, misses)
		}
		if after.PutFailures-before.PutFailures != int64(failedPuts) || after.Misses-before.Misses < int64(misses) {
			t.Fatalf("stats before %+v after %+v; the driver saw %d failed puts, %d misses", before, after, failedPuts, misses)
		}
		if w := max(fast.maxWait, durable.maxWait); w > 3*cfg.Timeout {
			t.Fatalf("a call took %v against a dead master (timeout %v)", w, cfg.Timeout)
		}
	})

	t.Run("killed master returns", func(t *testing.T) {
		if killed == nil {
			t.Skip("no master was killed")
		}
		if err := killed.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if err := cl.WaitHealthy(ctx, 15*time.Second); err != nil {
			t.Fatal(err)
		}
		// It came back as the replica of its successor: durable puts
		// to those slots are confirmed again.
		for _, d := range []*driver{fast, durable} {
			keys := d.pages(32)
			if errs := d.put(keys, 10*time.Second); firstErr(errs) != nil {
				t.Fatalf("puts failed with every node back: %v", firstErr(errs))
			}
			if ok, _ := count(d.get(keys)); ok != len(keys) {
				t.Fatalf("%d of %d hits with every node back", ok, len(keys))
			}
		}
	})
	fast.checkNoWrongBytes()
	durable.checkNoWrongBytes()
}

// TestMetrics checks that the Prometheus counters follow the stats.
func TestMetrics(t *testing.T) {
	srv := redistest.StandaloneT(t, redistest.Options{})
	cfg := baseConfig(redis.ModeStandalone, []string{srv.Addr()})
	cfg.KeyPrefix = uniquePrefix(t)
	g := geometry()
	slab := tiertest.NewHeapSlab(2 * driverSlots * g.Kinds[0].PageBytes)
	reg := prometheus.NewRegistry()
	st, err := redis.Open(context.Background(), tiers.Env{
		Logger: testLogger(t), Registerer: reg, Payload: g, Rank: 1, WorldSize: 2, Slab: slab,
	}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d := &driver{t: t, store: st, slab: slab, size: g.Kinds[0].PageBytes, rng: rand.New(rand.NewPCG(faultSeed, 5))}
	keys := d.pages(4)
	d.put(keys[:3], 5*time.Second)
	d.get(keys)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			got[mf.GetName()] = m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{
		"kvtier_redis_get_hits_total": 3, "kvtier_redis_get_misses_total": 1, "kvtier_redis_get_corrupt_total": 0,
		"kvtier_redis_put_items_total": 3, "kvtier_redis_put_failed_total": 0,
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v (all: %v)", name, got[name], v, got)
		}
	}
}

func firstErr(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// TestConcurrentPutsOfOnePage has two stores (two hosts) put the same pages
// at once, over and over, while both read them: a put is a SET of the
// payload then an APPEND of the trailer, so two of them can interleave.
// No hit is ever wrong; a value left torn is rewritten by the put that saw
// it, and once the puts stop every page hits.
func TestConcurrentPutsOfOnePage(t *testing.T) {
	t.Parallel()
	srv := redistest.StandaloneT(t, redistest.Options{})
	cfg := baseConfig(redis.ModeStandalone, []string{srv.Addr()})
	cfg.KeyPrefix = uniquePrefix(t)
	cfg.PipelineDepth = 2
	a, b := newDriver(t, cfg, faultSeed+5), newDriver(t, cfg, faultSeed+5)
	keys := a.pages(8)
	done := make(chan struct{})
	for _, d := range []*driver{a, b} {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 40 {
				for _, err := range d.put(keys, 10*time.Second) {
					if err != nil && !strings.Contains(err.Error(), "another put of the same page") {
						t.Errorf("put: %v", err)
					}
				}
				d.get(keys)
			}
		}()
	}
	<-done
	<-done
	if _, failed := count(a.put(keys, 5*time.Second)); failed != 0 {
		t.Fatal("a put after the race failed")
	}
	for _, d := range []*driver{a, b} {
		if ok, _ := count(d.get(keys)); ok != len(keys) {
			t.Fatalf("%d of %d pages hit after the puts stopped", ok, len(keys))
		}
		d.checkNoWrongBytes()
	}
	t.Logf("store a %+v, store b %+v", a.store.Stats(), b.store.Stats())
}

// Package redisbench measures the Redis Store against the raw client in the
// same run: put and get throughput of pages through tiers/redis (trailer,
// CRC-32C, verification, acks, slab copies included) and a plain
// pipelined go-redis SET and GET of the same bytes on the same server. The
// ratio store/raw is what the store costs over the client it is built on.
// A third row, redis/put_vs_checksummed, sets the store's put against the
// raw SET with each page's CRC-32C computed beside its write: what the
// checksum alone costs, apart from the store's own structure.
//
// Rounds of the two sides alternate (ABBA) so that drift in the machine's
// load hits both alike. It is `kvtier bench redis`; it never decides
// anything and keeps no state between runs.
package redisbench

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/kvtier/kvtier/internal/crc32c"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/redis"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// Config is one run.
type Config struct {
	// Store is the store's config (mode, addresses, pipeline depth...).
	// Its key prefix is used as is; the raw side writes under Prefix+"raw:".
	Store redis.Config
	// PageBytes is the payload size of one page (default 2.75 MiB).
	PageBytes int64
	// BatchPages is the number of pages per Put or Get call (default 32).
	BatchPages int
	// Rounds is the number of measured rounds per side and operation
	// (default 10), after one warm-up round each.
	Rounds int
	// Seed seeds the page contents and keys.
	Seed uint64
	// Logger receives the store's logs.
	Logger *slog.Logger
}

// Target is the store/raw ratio the project aims for.
const Target = 0.9

func (c *Config) defaults() {
	if c.PageBytes <= 0 {
		c.PageBytes = 2816 << 10 // 2.75 MiB
	}
	if c.BatchPages <= 0 {
		c.BatchPages = 32
	}
	if c.Rounds <= 0 {
		c.Rounds = 10
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Run measures and returns the rows redis/put, redis/get and
// redis/put_vs_checksummed in GB/s, each with its raw client's figure as
// the limit.
func Run(ctx context.Context, cfg Config) ([]benchreport.Result, error) {
	cfg.defaults()
	n := cfg.BatchPages
	g := tiers.PayloadGeometry{PageTokens: 1, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: cfg.PageBytes}}}
	// Sources in the first half of the slab, get destinations in the second.
	slab := tiertest.NewHeapSlab(2 * int64(n) * cfg.PageBytes)
	st, err := redis.Open(ctx, tiers.Env{Logger: cfg.Logger, Payload: g, WorldSize: 1, Slab: slab, ColdStart: tiers.ColdStartLoad}, cfg.Store)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	raw := rawClient(cfg.Store)
	defer raw.Close()

	r := rand.New(rand.NewPCG(cfg.Seed, 0x7265646973))
	keys := make([]tiers.Key, n)
	rawKeys := make([]string, n)
	prev := pagehash.Root
	puts := make([]tiers.PutRequest, n)
	gets := make([]tiers.GetRequest, n)
	for i := range keys {
		prev = pagehash.Next(prev, []uint32{r.Uint32()})
		keys[i] = tiers.Key{Hash: prev}
		rawKeys[i] = fmt.Sprintf("%sraw:%s", cfg.Store.KeyPrefix, prev)
		src := tiers.Span{Offset: int64(i) * cfg.PageBytes, Length: cfg.PageBytes}
		b, err := slab.Bytes(src)
		if err != nil {
			return nil, err
		}
		for j := 0; j+8 <= len(b); j += 8 {
			binary.LittleEndian.PutUint64(b[j:], r.Uint64())
		}
		puts[i] = tiers.PutRequest{Key: keys[i], Src: src}
		gets[i] = tiers.GetRequest{Key: keys[i], Dst: tiers.Span{Offset: int64(n+i) * cfg.PageBytes, Length: cfg.PageBytes}}
	}
	srcs := make([][]byte, n)
	for i := range srcs {
		srcs[i], _ = slab.Bytes(puts[i].Src)
	}

	// summed are the same puts with the producer's CRC-32C, taken where
	// the producer read the page anyway (the page-store door's Commit, an
	// engine's completion): the store writes it as given and every read
	// verifies it, without reading the page for it.
	summed := make([]tiers.PutRequest, n)
	for i, p := range puts {
		p.Sum, p.HasSum = crc32c.Checksum(srcs[i]), true
		summed[i] = p
	}
	putWith := func(reqs []tiers.PutRequest) func() error {
		return func() error {
			id, err := st.Put(ctx, reqs)
			if err != nil {
				return err
			}
			return waitDurable(ctx, st, id, n, cfg.Store.Timeout+10*time.Second)
		}
	}
	storePut, storePutSummed := putWith(puts), putWith(summed)
	results := make([]error, n)
	storeGet := func() error {
		if err := st.Get(ctx, gets, results); err != nil {
			return err
		}
		for i, e := range results {
			if e != nil {
				return fmt.Errorf("store get item %d: %w", i, e)
			}
		}
		return nil
	}
	rawPut := func() error {
		pipe := raw.Pipeline()
		for i, k := range rawKeys {
			pipe.Set(ctx, k, srcs[i], cfg.Store.TTL)
		}
		_, err := pipe.Exec(ctx)
		return err
	}
	// rawPutCRC is rawPut with each page's CRC-32C computed on its own
	// goroutine as go-redis starts writing the page, as the store does:
	// the least any put that checksums its pages costs with this client.
	crcs := make([]uint32, n)
	rawPutCRC := func() error {
		var wg sync.WaitGroup
		pipe := raw.Pipeline()
		for i, k := range rawKeys {
			pipe.Set(ctx, k, checksummed{src: srcs[i], crc: &crcs[i], wg: &wg}, cfg.Store.TTL)
		}
		_, err := pipe.Exec(ctx)
		wg.Wait()
		return err
	}
	rawGet := func() error {
		pipe := raw.Pipeline()
		cmds := make([]*goredis.StringCmd, n)
		for i, k := range rawKeys {
			cmds[i] = pipe.Get(ctx, k)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
		for i, c := range cmds {
			b, err := c.Bytes()
			if err != nil {
				return err
			}
			if int64(len(b)) != cfg.PageBytes {
				return fmt.Errorf("raw get %d: %d bytes, want %d", i, len(b), cfg.PageBytes)
			}
		}
		return nil
	}
	bytesPerRound := float64(n) * float64(cfg.PageBytes)
	putSummed, putSummedRaw, err := abba(cfg.Rounds, storePutSummed, rawPut)
	if err != nil {
		return nil, fmt.Errorf("put rounds: %w", err)
	}
	putStore, putRaw, err := abba(cfg.Rounds, storePut, rawPut)
	if err != nil {
		return nil, fmt.Errorf("put rounds, the store's own sums: %w", err)
	}
	putStore2, putCRC, err := abba(cfg.Rounds, storePut, rawPutCRC)
	if err != nil {
		return nil, fmt.Errorf("checksummed put rounds: %w", err)
	}
	getStore, getRaw, err := abba(cfg.Rounds, storeGet, rawGet)
	if err != nil {
		return nil, fmt.Errorf("get rounds: %w", err)
	}
	note := fmt.Sprintf("%s %v, %d x %.2f MiB pages per call, pipeline_depth %d, median of %d rounds (ABBA)",
		cfg.Store.Mode, cfg.Store.Addresses, n, float64(cfg.PageBytes)/(1<<20), cfg.Store.PipelineDepth, cfg.Rounds)
	row := func(name string, store, raw []time.Duration, limitName string) benchreport.Result {
		return benchreport.Result{
			Bench: name, Value: bytesPerRound / median(store).Seconds() / 1e9, Unit: "GB/s", Target: Target, Note: note,
		}.WithLimit(limitName, bytesPerRound/median(raw).Seconds()/1e9)
	}
	own := row("redis/put_own_sum", putStore, putRaw, "go-redis pipelined SET")
	own.Target = 0 // NB: informs: a producer that gives no sum (an old plugin's caller)
	crcRow := row("redis/put_vs_checksummed", putStore2, putCRC, "go-redis pipelined SET, CRC-32C of each page beside its write")
	crcRow.Target = 0 // NB: informs; the target is redis/put's
	return []benchreport.Result{
		row("redis/put", putSummed, putSummedRaw, "go-redis pipelined SET"),
		row("redis/get", getStore, getRaw, "go-redis pipelined GET"),
		own,
		crcRow,
	}, nil
}

// checksummed is a SET value argument that starts the CRC-32C of its bytes
// on a goroutine when go-redis marshals it, just before writing them.
type checksummed struct {
	src []byte
	crc *uint32
	wg  *sync.WaitGroup
}

func (c checksummed) MarshalBinary() ([]byte, error) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		*c.crc = crc32c.Checksum(c.src)
	}()
	return c.src, nil
}

// rawClient is a plain go-redis client of the same servers and timeouts.
func rawClient(c redis.Config) goredis.UniversalClient {
	if c.Mode == redis.ModeStandalone {
		return goredis.NewClient(&goredis.Options{Addr: c.Addresses[0], Protocol: 2, DisableIdentity: true,
			DialTimeout: c.DialTimeout, ReadTimeout: c.Timeout, WriteTimeout: c.Timeout, ContextTimeoutEnabled: true})
	}
	return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: c.Addresses, Protocol: 2, DisableIdentity: true,
		DialTimeout: c.DialTimeout, ReadTimeout: c.Timeout, WriteTimeout: c.Timeout, ContextTimeoutEnabled: true})
}

// abba runs one warm-up of each side, then rounds of each in the order
// A B B A A B B A ..., and returns each side's round times.
func abba(rounds int, a, b func() error) (ta, tb []time.Duration, err error) {
	if err := a(); err != nil {
		return nil, nil, fmt.Errorf("store warm-up: %w", err)
	}
	if err := b(); err != nil {
		return nil, nil, fmt.Errorf("raw warm-up: %w", err)
	}
	sides := [2]func() error{a, b}
	times := [2][]time.Duration{}
	for i := range rounds {
		order := [2]int{0, 1}
		if i%2 == 1 {
			order = [2]int{1, 0}
		}
		for _, side := range order {
			start := time.Now()
			if err := sides[side](); err != nil {
				return nil, nil, err
			}
			times[side] = append(times[side], time.Since(start))
		}
	}
	return times[0], times[1], nil
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// waitDurable waits for n terminal acks of batch id; any failure is an
// error.
func waitDurable(ctx context.Context, st tiers.Store, id tiers.BatchID, n int, limit time.Duration) error {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	var buf []tiers.Ack
	for n > 0 {
		buf = st.DrainAcks(buf[:0])
		for _, a := range buf {
			if a.Batch != id {
				continue
			}
			switch a.Stage {
			case tiers.AckDurable:
				n--
			case tiers.AckFailed:
				return fmt.Errorf("put item %d: %w", a.Index, a.Err)
			}
		}
		if n == 0 {
			return nil
		}
		select {
		case <-st.AckReady():
		case <-deadline.C:
			return fmt.Errorf("%d items not durable after %v", n, limit)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	pb "github.com/kvtier/kvtier/api/storev1"
	"github.com/kvtier/kvtier/bench/filestore"
	"github.com/kvtier/kvtier/bench/l3bench"
	"github.com/kvtier/kvtier/client/storeclient"
	"github.com/kvtier/kvtier/host/serve"
	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/kvtier/kvtier/quantity"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
)

// storeBench is one `kvtier bench store` run's shape.
type storeBench struct {
	pageBytes  int64 // one payload kind "kv" of this many bytes a page
	batch      int   // keys per call (SGLang batches up to 128)
	l2Batches  int   // the L2 slab holds this many batches
	fileFactor int   // vs-file's working set, in L2 slabs
	rounds     int   // timed rounds of each row (after one warm-up)
	exists     int   // BatchExists and Ping calls each
	dir, fio   string
	drop       bool // drop the page cache before each side's get phase of vs-file
	seed       uint64
	bgNice     bool // serve's --background-nice: enableBackgroundNice before the rounds
	logger     *slog.Logger
}

// newBenchStoreCmd returns `kvtier store`.
func newBenchStoreCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "store [flags]",
		Short: "the page-store door over its socket against memcpy, fio and a file-per-page store",
		Long: `Runs an in-process kvtier serve with only the page-store door (kvtier.store.v1) on a unix socket, driven by the Go client
(client/storeclient) the way an SGLang rank drives it, each row against a
limit measured in the same run.`,
		Example: `  kvtier bench store
  kvtier bench store --json`,
	}
	fs := cmd.Flags()
	pageBytes := fs.String("page-bytes", "2816KiB", "page `size` (one payload kind; 2816KiB is the seed's geometry)")
	batch := fs.Int("batch", 128, "`keys` per call (SGLang batches up to 128)")
	l2Batches := fs.Int("l2-batches", 2, "the L2 slab holds this many `batches`")
	fileFactor := fs.Int("file-factor", 4, "vs-file's working set in L2 slabs (the L3 holds it, plus one batch)")
	rounds := fs.Int("rounds", 5, "timed `rounds` of each row, after one warm-up; the median counts")
	exists := fs.Int("exists", 2000, "BatchExists `calls`, and as many empty Pings, interleaved")
	dir := fs.String("dir", os.TempDir(), "`directory` for the store's L3, its index, fio's file and the file-per-page store (one disk)")
	fio := fs.String("fio", "", "fio `binary` (default: fio from PATH; - to skip get-l3's limit)")
	drop := fs.Bool("drop-caches", true, "drop the page cache before each side's get phase of vs-file (root only; else the file store reads what the page cache kept, said in the row)")
	seed := fs.Uint64("seed", 1, "`seed` of vs-file's get pattern")
	asJSON := fs.Bool("json", false, "print one JSON object per line")
	bgNice := fs.Bool("background-nice", true, "serve's --background-nice (its default): the tiers' spill workers on nice-19 threads, GOMAXPROCS raised for the whole bench (in process)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		stdout := cmd.OutOrStdout()
		stderr := cmd.ErrOrStderr()
		pb, err := quantity.ParseSize(*pageBytes)
		switch {
		case fs.NArg() > 0:
			return fmt.Errorf("bench store: unexpected arguments %q: %w", fs.Args(), errUsage)
		case err != nil:
			return fmt.Errorf("bench store: --page-bytes: %w: %w", err, errUsage)
		case pb < 4096 || pb > 64<<20 || pb%4096 != 0:
			return fmt.Errorf("bench store: --page-bytes %s: want a multiple of 4KiB in 4KiB..64MiB: %w", *pageBytes, errUsage)
		case *batch < 1 || *batch > 1024:
			return fmt.Errorf("bench store: --batch %d: want 1..1024 (the door's batch limit): %w", *batch, errUsage)
		case *l2Batches < 2 || *l2Batches > 64:
			return fmt.Errorf("bench store: --l2-batches %d: want 2..64: %w", *l2Batches, errUsage)
		case *fileFactor < 2 || *fileFactor > 64:
			return fmt.Errorf("bench store: --file-factor %d: want 2..64: %w", *fileFactor, errUsage)
		case *rounds < 1 || *rounds > 1000:
			return fmt.Errorf("bench store: --rounds %d: want 1..1000: %w", *rounds, errUsage)
		case *exists < 10 || *exists > 1_000_000:
			return fmt.Errorf("bench store: --exists %d: want 10..1000000: %w", *exists, errUsage)
		}
		o := storeBench{pageBytes: int64(pb), batch: *batch, l2Batches: *l2Batches, fileFactor: *fileFactor, rounds: *rounds,
			exists: *exists, dir: *dir, fio: *fio, drop: *drop, seed: *seed, bgNice: *bgNice, logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError}))}
		bb := o.batchBytes()
		// RAM: the L2 slab, the client's source and destination batches, and
		// a small second serve's slab for the unchecked get.
		if need := saturatingMul(bb, int64(o.l2Batches+2+2)); need > machineOf(ctx).MemAvailable {
			return fmt.Errorf("bench store: --page-bytes %s, --batch %d, --l2-batches %d need %s of memory, %s has %s: %w",
				*pageBytes, o.batch, o.l2Batches, quantity.Size(need), machineOf(ctx).MemSource, quantity.Size(machineOf(ctx).MemAvailable), errUsage)
		}
		// Disk: the L3 budget, the file store's working set and fio's file.
		if err := os.MkdirAll(o.dir, 0o755); err != nil {
			return fmt.Errorf("bench store: --dir: %w", err)
		}
		if free, err := machineOf(ctx).FreeDisk(o.dir); err == nil {
			l3 := max(o.rounds+3, o.workBatches()+1)
			if need := o.l3Budget(l3) + saturatingMul(bb, int64(o.workBatches()+1)); need > free {
				return fmt.Errorf("bench store: needs %s of disk under %s (an L3 of %d batches of %s, the file store's %d, fio's one), %s is free: %w",
					quantity.Size(need), o.dir, l3, quantity.Size(bb), o.workBatches(), quantity.Size(free), errUsage)
			}
		}
		rows, err := o.run(ctx)
		if err != nil {
			return err
		}
		return benchreport.Write(stdout, rows, *asJSON)
	}
	return cmd
}

func (o storeBench) batchBytes() int64 { return o.pageBytes * int64(o.batch) }

// l3Budget is an l3disk budget that holds batches whole: a slot per page
// with its 4 KiB header (8 KiB counted), and a quarter more so the
// store's own reclaim, which starts before it is full, evicts none of
// them.
func (o storeBench) l3Budget(batches int) int64 {
	return int64(batches) * int64(o.batch) * (o.pageBytes + 8<<10) * 5 / 4
}
func (o storeBench) workBatches() int { return o.l2Batches * o.fileFactor }

// yaml is the door's stack: one payload kind, an L2 slab of l2Batches
// batches (2 MiB-rounded, hugetlbfs or the shm fallback) written through
// to an l3disk of l3Batches batches with an LMDB index.
func (o storeBench) yaml(l2Batches, l3Batches int) string {
	l2 := (int64(l2Batches)*o.batchBytes() + 2<<20 - 1) &^ (2<<20 - 1)
	l3 := o.l3Budget(l3Batches)
	return fmt.Sprintf(`version: 1
model:
  page_tokens: 64
  payloads:
    - {name: kv, page_bytes: %dKiB}
tiers:
  - name: l2
    role: slab
    use: l2hugetlb
    config: {size: %dKiB, fallback: shm, name: "kvtier-benchstore-{{DIRHASH}}", stale: remove, populate: true}
  - name: l3
    role: store
    use: l3disk
    index: {use: lmdb, config: {dir: "{{DIR}}/store/index"}}
    config:
      disks: [{dir: "{{DIR}}/store/l3", budget: %dKiB}]
policy:
  evictor: lru
  planner: heap
write_policy: write_through
ranks: {world_size: 1, rank: 0}
`, o.pageBytes>>10, l2>>10, l3>>10)
}

// benchServe is an in-process serve with the store door only, and a
// client of it.
type benchServe struct {
	s *serve.Server
	// c carries the checksums (the clients' way); rel lets the door
	// check while it copies (check_at_release); first waits for the
	// door's check before the reply.
	c, rel, first *storeclient.Client
	stop          context.CancelFunc
	done          chan error
	remove        []string
}

func (o storeBench) open(ctx context.Context, l2Batches, l3Batches int, skipVerify bool) (*benchServe, error) {
	data, err := os.MkdirTemp(o.dir, "kvtier-bench-store-")
	if err != nil {
		return nil, fmt.Errorf("bench store: %w", err)
	}
	sd, err := os.MkdirTemp("", "kbst")
	if err != nil {
		os.RemoveAll(data)
		return nil, fmt.Errorf("bench store: %w", err)
	}
	b := &benchServe{remove: []string{data, sd}, done: make(chan error, 1)}
	sctx, stop := context.WithCancel(ctx)
	b.stop = stop
	sock := filepath.Join(sd, "s.sock")
	b.s, err = serve.Open(sctx, serve.Config{Doors: []string{serve.DoorStore}, StoreYAML: o.yaml(l2Batches, l3Batches),
		StoreConfigName: "bench store stack", DataDir: data, Socket: sock, StoreSkipVerify: skipVerify, Logger: o.logger})
	if err != nil {
		b.close()
		return nil, fmt.Errorf("bench store: %w", err)
	}
	go func() { b.done <- b.s.Serve(sctx) }()
	select {
	case <-b.s.Listening():
	case err := <-b.done:
		b.done <- err
		b.close()
		return nil, fmt.Errorf("bench store: %w", err)
	}
	ns := &pb.Namespace{Model: "kvtier-bench-store", Dtype: "bfloat16", KvLayout: "page_first", PageTokens: 64, TpSize: 1,
		Kinds: []*pb.PayloadKind{{Name: "kv", PageBytes: uint64(o.pageBytes)}}}
	if b.c, err = storeclient.Dial(ctx, storeclient.Options{Socket: sock, ClientID: "bench", Namespace: ns, ClientSums: true}); err != nil {
		b.close()
		return nil, fmt.Errorf("bench store: %w", err)
	}
	if b.rel, err = storeclient.Dial(ctx, storeclient.Options{Socket: sock, ClientID: "bench-check-at-release", Namespace: ns, CheckAtRelease: true}); err != nil {
		b.close()
		return nil, fmt.Errorf("bench store: %w", err)
	}
	if b.first, err = storeclient.Dial(ctx, storeclient.Options{Socket: sock, ClientID: "bench-check-first", Namespace: ns}); err != nil {
		b.close()
		return nil, fmt.Errorf("bench store: %w", err)
	}
	return b, nil
}

func (b *benchServe) close() error {
	var err error
	for _, c := range []*storeclient.Client{b.c, b.rel, b.first} {
		if c != nil {
			_ = c.Close(context.Background())
		}
	}
	if b.stop != nil {
		b.stop()
		if b.s != nil {
			err = <-b.done
		}
	}
	for _, p := range b.remove {
		os.RemoveAll(p)
	}
	return err
}

// settle waits until the door's write-through has landed (every committed
// page is in the L3 and evictable).
func (b *benchServe) settle(ctx context.Context) error {
	for b.s.StoreDoor().PendingPuts() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

// pattern fills page with key id's bytes: 4 KiB blocks whose first 8
// bytes name the key and the block, the rest a fixed per-key fill.
func pattern(page []byte, id uint64) {
	var fill [4096]byte
	x := id*0x9e3779b97f4a7c15 + 1
	for i := 0; i < len(fill); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(fill[i:], x)
	}
	for off := 0; off < len(page); off += len(fill) {
		n := copy(page[off:], fill[:])
		if n >= 8 {
			binary.LittleEndian.PutUint64(page[off:], id<<24|uint64(off/len(fill)))
		}
	}
}

// wrongPage reports whether page differs from key id's pattern.
func wrongPage(page, want []byte, id uint64) bool {
	pattern(want, id)
	return !bytes.Equal(page, want)
}

// keysOf names batch n's keys; ids are batch*batchSize+i.
func (o storeBench) keysOf(n int) ([]string, []uint64) {
	keys := make([]string, o.batch)
	ids := make([]uint64, o.batch)
	for i := range keys {
		ids[i] = uint64(n*o.batch + i)
		keys[i] = "bench-" + strconv.FormatUint(ids[i], 10)
	}
	return keys, ids
}

// memory is the client's host pool: a source batch and a destination
// batch, touched before any timing.
type memory struct {
	src, dst [][]byte
	scratch  []byte
	hit      []bool // the last get's hits
}

func (o storeBench) memory() memory {
	m := memory{src: make([][]byte, o.batch), dst: make([][]byte, o.batch), scratch: make([]byte, o.pageBytes), hit: make([]bool, o.batch)}
	sb, db := make([]byte, o.batchBytes()), make([]byte, o.batchBytes())
	for i := range o.batch {
		m.src[i] = sb[int64(i)*o.pageBytes : int64(i+1)*o.pageBytes]
		m.dst[i] = db[int64(i)*o.pageBytes : int64(i+1)*o.pageBytes]
	}
	for i := range db {
		db[i] = 1
	}
	return m
}

// fillSrc writes ids' patterns into the source pages.
func (m memory) fillSrc(ids []uint64) {
	for i, id := range ids {
		pattern(m.src[i], id)
	}
}

// set stores a batch through the door: BatchSet, the client's copy into
// the reserved spans, Commit. It returns the pages stored.
func (m memory) set(ctx context.Context, c *storeclient.Client, keys []string) (int, error) {
	rs, err := c.Set(ctx, keys)
	if err != nil {
		return 0, err
	}
	written := make([]bool, len(keys))
	for i, st := range rs.Status {
		if st == pb.SetStatus_SET_STATUS_RESERVED {
			if err := rs.CopyIn(i, m.src[i]); err != nil {
				return 0, err
			}
			written[i] = true
		}
	}
	stored, err := c.Commit(ctx, rs, written)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range stored {
		if s {
			n++
		}
	}
	return n, nil
}

// get loads a batch through the door: BatchGet (reloading from L3 within
// the deadline), the client's copy out of the pinned spans, Release. It
// returns the hits, and marks them in m.hit.
func (m memory) get(ctx context.Context, c *storeclient.Client, keys []string) (int, error) {
	clear(m.hit)
	g, err := c.Get(ctx, keys, 30_000)
	if err != nil {
		return 0, err
	}
	for i, st := range g.Status {
		if st == pb.GetStatus_GET_STATUS_HIT {
			if _, err := g.CopyOut(i, m.dst[i]); err != nil {
				return 0, err
			}
		}
	}
	if err := c.Release(ctx, g); err != nil {
		return 0, err
	}
	// A hit counts once its copy or Release confirmed it (a check that
	// failed turns it CORRUPT).
	hits := 0
	for i, st := range g.Status {
		if st == pb.GetStatus_GET_STATUS_HIT {
			m.hit[i] = true
			hits++
		}
	}
	return hits, nil
}

// check counts the destination pages of the last get's hits that differ
// from ids' patterns.
func (m memory) check(ids []uint64) int {
	wrong := 0
	for i, h := range m.hit[:len(ids)] {
		if h && wrongPage(m.dst[i], m.scratch, ids[i]) {
			wrong++
		}
	}
	return wrong
}

// storeRun gathers a run's figures.
type storeRun struct {
	getL2, getL2Mem, getL2NoCheck, getL2NoCheckMem []float64 // seconds a batch
	getL2First, getL2Rel                           []float64
	set, setMem                                    []float64
	pausePingUs                                    []float64 // the untimed Ping after each set round's pause
	getL3, fioRead, fioWrite                       float64   // seconds a batch (median); bytes/s
	getL3Hits, getL3Pages                          int
	existsUs, pingUs                               []float64
	kvSet, kvGet, fileSet, fileGet                 float64 // seconds, vs-file phases
	fileCold, vsPages                              int
	wrong                                          int
	fioErr                                         error
}

func allTrue(v []bool) bool {
	for _, b := range v {
		if !b {
			return false
		}
	}
	return true
}

func secs(f func() error) (float64, error) {
	t0 := time.Now()
	err := f()
	return time.Since(t0).Seconds(), err
}

func (o storeBench) run(ctx context.Context) ([]benchreport.Result, error) {
	if o.bgNice {
		enableBackgroundNice()
	}
	var r storeRun
	m := o.memory()
	if err := o.runL2(ctx, &r, m, false); err != nil {
		return nil, err
	}
	if err := o.runL2(ctx, &r, m, true); err != nil {
		return nil, err
	}
	if err := o.runDisk(ctx, &r, m); err != nil {
		return nil, err
	}
	if r.wrong != 0 {
		return nil, fmt.Errorf("bench store: %d wrong pages read back", r.wrong)
	}
	return o.rows(r), nil
}

// runL2 measures get-l2 (with the door's CRC check at get unless
// skipVerify) against a memcpy of the same pinned bytes, set against a
// memcpy of the same byte count, and, with the check on, exists against
// an empty call, on a serve whose L3 holds a few batches.
func (o storeBench) runL2(ctx context.Context, r *storeRun, m memory, skipVerify bool) error {
	// The L3 holds every batch this serve sets (batch 0 and a fresh one
	// each set round), so nothing leaves it.
	b, err := o.open(ctx, o.l2Batches, o.rounds+3, skipVerify)
	if err != nil {
		return err
	}
	defer b.close()
	keys, ids := o.keysOf(0)
	m.fillSrc(ids)
	if n, err := m.set(ctx, b.c, keys); err != nil || n != o.batch {
		return fmt.Errorf("bench store: set batch 0: %d of %d stored: %v", n, o.batch, err)
	}
	get, mem := &r.getL2, &r.getL2Mem
	client := b.c
	if skipVerify {
		// A serve that checks no hits, and a client that checks none.
		get, mem, client = &r.getL2NoCheck, &r.getL2NoCheckMem, b.rel
	}
	for round := range o.rounds + 1 {
		var hits int
		tg, err := secs(func() error { var err error; hits, err = m.get(ctx, client, keys); return err })
		if err != nil || hits != o.batch {
			return fmt.Errorf("bench store: get-l2 round %d: %d of %d hits: %v", round, hits, o.batch, err)
		}
		r.wrong += m.check(ids)
		if !skipVerify {
			tr, err := secs(func() error { var err error; hits, err = m.get(ctx, b.rel, keys); return err })
			if err != nil || hits != o.batch {
				return fmt.Errorf("bench store: get-l2 (check at release) round %d: %d of %d hits: %v", round, hits, o.batch, err)
			}
			r.wrong += m.check(ids)
			if round > 0 {
				r.getL2Rel = append(r.getL2Rel, tr)
			}
			tf, err := secs(func() error { var err error; hits, err = m.get(ctx, b.first, keys); return err })
			if err != nil || hits != o.batch {
				return fmt.Errorf("bench store: get-l2 (check first) round %d: %d of %d hits: %v", round, hits, o.batch, err)
			}
			r.wrong += m.check(ids)
			if round > 0 {
				r.getL2First = append(r.getL2First, tf)
			}
		}
		// The limit: the same pinned bytes copied by memcpy alone.
		g, err := b.c.Get(ctx, keys, 30_000)
		if err != nil {
			return fmt.Errorf("bench store: get-l2 round %d: %w", round, err)
		}
		t0 := time.Now()
		for i := range g.Spans {
			copy(m.dst[i], g.Spans[i][0])
		}
		tm := time.Since(t0).Seconds()
		if err := b.c.Release(ctx, g); err != nil {
			return fmt.Errorf("bench store: get-l2 round %d: %w", round, err)
		}
		if round > 0 {
			*get, *mem = append(*get, tg), append(*mem, tm)
		}
	}
	if skipVerify {
		return nil
	}
	// set: fresh keys each round into a slab with room (the write-through
	// of the round before has landed, untimed); the limit is a memcpy of
	// the same byte count between the client's two batches.
	for round := range o.rounds + 1 {
		if err := b.settle(ctx); err != nil {
			return err
		}
		keys, ids := o.keysOf(1 + round)
		m.fillSrc(ids)
		// The door's write-through has landed; the l3disk's own work
		// after its gather (its checksum, the O_DIRECT write, the index
		// commit) still runs: a pause, so this row measures a set into
		// an idle store. store/set-sustained counts that work.
		time.Sleep(300 * time.Millisecond)
		// On these VMs the first call after such a pause waits for an
		// idle CPU to wake: a Ping then takes 1-1.6 ms against 0.1-0.25
		// ms for the next. An engine's sets come while it runs; an
		// untimed Ping pays that wake-up, not the set.
		pingUs, err := secs(func() error { return b.c.Ping(ctx) })
		if err != nil {
			return fmt.Errorf("bench store: set round %d: ping: %w", round, err)
		}
		r.pausePingUs = append(r.pausePingUs, pingUs*1e6)
		// The set's time: BatchSet + the copy into the reserved spans +
		// Commit; the limit: a memcpy of the same bytes into the same
		// spans just before (reserved, so nobody reads them).
		t0 := time.Now()
		rs, err := b.c.Set(ctx, keys)
		if err != nil {
			return fmt.Errorf("bench store: set round %d: %w", round, err)
		}
		tSet := time.Since(t0)
		written := make([]bool, len(keys))
		for i, st := range rs.Status {
			if st != pb.SetStatus_SET_STATUS_RESERVED {
				return fmt.Errorf("bench store: set round %d: key %d %v, want RESERVED", round, i, st)
			}
			written[i] = true
		}
		t0 = time.Now()
		for i := range m.src {
			copy(rs.Spans[i][0], m.src[i])
		}
		tm := time.Since(t0).Seconds()
		t0 = time.Now()
		for i := range m.src {
			if err := rs.CopyIn(i, m.src[i]); err != nil {
				return fmt.Errorf("bench store: set round %d: %w", round, err)
			}
		}
		stored, err := b.c.Commit(ctx, rs, written)
		ts := (tSet + time.Since(t0)).Seconds()
		if err != nil || !allTrue(stored) {
			return fmt.Errorf("bench store: set round %d: stored %v: %v", round, stored, err)
		}
		if hits, err := m.get(ctx, b.c, keys); err != nil || hits != o.batch {
			return fmt.Errorf("bench store: set round %d read back: %d of %d hits: %v", round, hits, o.batch, err)
		}
		r.wrong += m.check(ids)
		if round > 0 {
			r.set, r.setMem = append(r.set, ts), append(r.setMem, tm)
		}
	}
	// exists: the last batch, all in L2, against an empty Ping, interleaved.
	keys, _ = o.keysOf(o.rounds + 1)
	for i := range 2 * o.exists {
		var n int
		t0 := time.Now()
		if i%2 == 0 {
			n, _, err = b.c.Exists(ctx, keys)
		} else {
			err = b.c.Ping(ctx)
		}
		us := float64(time.Since(t0).Nanoseconds()) / 1e3
		if err != nil {
			return fmt.Errorf("bench store: exists: %w", err)
		}
		if i%2 == 0 {
			if n != o.batch {
				return fmt.Errorf("bench store: exists: %d of %d present", n, o.batch)
			}
			r.existsUs = append(r.existsUs, us)
		} else {
			r.pingUs = append(r.pingUs, us)
		}
	}
	return nil
}

// runDisk sets vs-file's working set (fileFactor L2 slabs) through the
// door and through the file-per-page store, measures get-l3 (batches that
// left the slab, reloaded from the l3disk) against fio's read of the same
// page size, then runs the same seeded get pattern on both stores.
func (o storeBench) runDisk(ctx context.Context, r *storeRun, m memory) error {
	W := o.workBatches()
	b, err := o.open(ctx, o.l2Batches, W+1, false)
	if err != nil {
		return err
	}
	defer b.close()
	fdir, err := os.MkdirTemp(o.dir, "kvtier-bench-filestore-")
	if err != nil {
		return fmt.Errorf("bench store: %w", err)
	}
	defer os.RemoveAll(fdir)
	fst, err := filestore.Open(fdir)
	if err != nil {
		return fmt.Errorf("bench store: %w", err)
	}
	// Set phase, both stores, the same batches. The door's sets wait for
	// room (the write-through landing) where the slab is full of pages
	// not yet in the L3: that wait is part of its time.
	for n := range W {
		keys, ids := o.keysOf(100 + n)
		m.fillSrc(ids)
		t, err := secs(func() error {
			left := keys
			src := m.src
			for len(left) > 0 {
				rs, err := b.c.Set(ctx, left)
				if err != nil {
					return err
				}
				written := make([]bool, len(left))
				for i, st := range rs.Status {
					if st == pb.SetStatus_SET_STATUS_RESERVED {
						copy(rs.Spans[i][0], src[i])
						written[i] = true
					}
				}
				stored, err := b.c.Commit(ctx, rs, written)
				if err != nil {
					return err
				}
				var nl []string
				var ns [][]byte
				for i, s := range stored {
					if !s {
						nl, ns = append(nl, left[i]), append(ns, src[i])
					}
				}
				if len(nl) > 0 {
					if err := b.settle(ctx); err != nil {
						return err
					}
				}
				left, src = nl, ns
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("bench store: vs-file set batch %d: %w", n, err)
		}
		r.kvSet += t
		t, err = secs(func() error {
			for i, k := range keys {
				if err := fst.Set(k, m.src[i]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("bench store: vs-file file set batch %d: %w", n, err)
		}
		r.fileSet += t
	}
	t, err := secs(func() error { return b.settle(ctx) })
	if err != nil {
		return err
	}
	r.kvSet += t
	// get-l3: the oldest batches left the slab (LRU); each round reads the
	// oldest batch not in the slab, which evicts the slab's oldest in turn.
	var tl3 []float64
	for round := range min(o.rounds+1, W-o.l2Batches) {
		keys, ids := o.keysOf(100 + round)
		var hits int
		t, err := secs(func() error { var err error; hits, err = m.get(ctx, b.c, keys); return err })
		if err != nil {
			return fmt.Errorf("bench store: get-l3 round %d: %w", round, err)
		}
		r.wrong += m.check(ids)
		if round > 0 {
			tl3 = append(tl3, t)
			r.getL3Hits += hits
			r.getL3Pages += o.batch
		}
	}
	r.getL3 = median(tl3)
	// fio on the same disk: pages of the same size, the l3disk's depth.
	fw, fr, err := l3bench.FioReadWrite(ctx, o.fio, filepath.Join(o.dir, fmt.Sprintf("kvtier-bench-store-fio-%d", os.Getpid())), o.pageBytes, int64(o.batch), 8)
	os.Remove(filepath.Join(o.dir, fmt.Sprintf("kvtier-bench-store-fio-%d", os.Getpid())))
	r.fioWrite, r.fioRead, r.fioErr = fw, fr, err
	// vs-file's get phase: 4 gets a batch of the working set, each get a
	// batch picked by a seeded draw: half the time one of the two batches
	// set last (hot), else any. The same draws for both stores.
	rng := rand.New(rand.NewPCG(o.seed, 0x6b76746965722d73))
	picks := make([]int, 4*W)
	for i := range picks {
		if rng.IntN(2) == 0 {
			picks[i] = W - 1 - rng.IntN(2)
		} else {
			picks[i] = rng.IntN(W)
		}
	}
	if o.drop && dropCaches() == nil {
		r.fileCold = 1
	}
	for _, p := range picks {
		keys, ids := o.keysOf(100 + p)
		var hits int
		t, err := secs(func() error { var err error; hits, err = m.get(ctx, b.c, keys); return err })
		if err != nil {
			return fmt.Errorf("bench store: vs-file get batch %d: %w", p, err)
		}
		if hits != o.batch {
			return fmt.Errorf("bench store: vs-file get batch %d: %d of %d hits", p, hits, o.batch)
		}
		r.kvGet += t
		r.wrong += m.check(ids)
	}
	if o.drop && dropCaches() != nil {
		r.fileCold = 0
	}
	for _, p := range picks {
		keys, ids := o.keysOf(100 + p)
		t, err := secs(func() error {
			for i, k := range keys {
				ok, err := fst.Get(k, m.dst[i])
				if err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("key %s not found", k)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("bench store: vs-file file get batch %d: %w", p, err)
		}
		r.fileGet += t
		for i := range m.hit {
			m.hit[i] = true
		}
		r.wrong += m.check(ids)
	}
	r.vsPages = (W + len(picks)) * o.batch
	return nil
}

// dropCaches writes back and drops the page cache (root only).
func dropCaches() error {
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("1\n"), 0)
}

func (o storeBench) rows(r storeRun) []benchreport.Result {
	bb := float64(o.batchBytes())
	geom := fmt.Sprintf("%s pages, batches of %d (%s), L2 slab of %d batches", quantity.Size(o.pageBytes), o.batch, quantity.Size(o.batchBytes()), o.l2Batches)
	gbps := func(sec float64) float64 {
		if sec <= 0 {
			return 0
		}
		return bb / sec / 1e9
	}
	rows := []benchreport.Result{
		benchreport.Result{Bench: "store/get-l2", Value: gbps(median(r.getL2)), Unit: "GB/s", Target: 0.8,
			Note: geom + "; BatchGet with client_verifies (the clients' way: the client checks every page's CRC32C in its copy out of the slab, one pass; serve reads no byte) + the copy + Release; median of " + strconv.Itoa(o.rounds)}.
			WithLimit("memcpy of the same pinned bytes", gbps(median(r.getL2Mem))),
		benchreport.Result{Bench: "store/get-l2-check-at-release", Value: gbps(median(r.getL2Rel)), Unit: "GB/s",
			Note: geom + "; as get-l2 with check_at_release instead (a client without a fast CRC32C: serve checks every page while the client copies it, Release waits for the check)"}.
			WithLimit("memcpy of the same pinned bytes", gbps(median(r.getL2Mem))),
		benchreport.Result{Bench: "store/get-l2-check-first", Value: gbps(median(r.getL2First)), Unit: "GB/s",
			Note: geom + "; as get-l2, the check done before BatchGet replies (check_at_release false)"}.
			WithLimit("memcpy of the same pinned bytes", gbps(median(r.getL2Mem))),
		benchreport.Result{Bench: "store/get-l2-unchecked", Value: gbps(median(r.getL2NoCheck)), Unit: "GB/s",
			Note: geom + "; as get-l2 on a serve with --store-verify=false (pages checked at commit and at reload only)"}.
			WithLimit("memcpy of the same pinned bytes", gbps(median(r.getL2NoCheckMem))),
		benchreport.Result{Bench: "store/set", Value: gbps(median(r.set)), Unit: "GB/s", Target: 0.8,
			Note: geom + fmt.Sprintf("; BatchSet + the client's copy into the reserved spans, with each page's CRC32C in the same pass + Commit with those sums (serve reads no byte), fresh keys into a slab with room (the write-through of the round before landed, untimed, then a 300 ms pause and an untimed Ping that pays the wake-up after it: median %.0f us, against %.0f us for the exists row's Pings)", median(r.pausePingUs), median(r.pingUs))}.
			WithLimit("memcpy of the same bytes into the same reserved spans", gbps(median(r.setMem))),
	}
	l3 := benchreport.Result{Bench: "store/get-l3", Value: gbps(r.getL3), Unit: "GB/s", Target: 0.8,
		Note: fmt.Sprintf("%s; batches that left the slab, reloaded from the l3disk (O_DIRECT, LMDB index, CRC checked) within the get, then copied; %d of %d pages hit", geom, r.getL3Hits, r.getL3Pages)}
	if r.fioErr != nil {
		l3.Note += "; no limit: " + r.fioErr.Error()
	} else {
		l3 = l3.WithLimit(fmt.Sprintf("fio O_DIRECT read, bs=%s, iodepth 8", quantity.Size(o.pageBytes)), r.fioRead/1e9)
	}
	rows = append(rows, l3)
	sustained := benchreport.Result{Bench: "store/set-sustained", Value: float64(o.workBatches()) * bb / r.kvSet / 1e9, Unit: "GB/s",
		Note: fmt.Sprintf("%s; vs-file's set phase: %d batches back to back into a slab of %d, each set waiting for room (the write-through to the l3disk landing) where the slab is full", geom, o.workBatches(), o.l2Batches)}
	if r.fioErr != nil {
		sustained.Note += "; no limit: " + r.fioErr.Error()
	} else {
		sustained = sustained.WithLimit(fmt.Sprintf("fio O_DIRECT write, bs=%s, iodepth 8", quantity.Size(o.pageBytes)), r.fioWrite/1e9)
	}
	rows = append(rows, sustained)
	slices.Sort(r.existsUs)
	slices.Sort(r.pingUs)
	p99 := func(v []float64) float64 { return v[len(v)*99/100] }
	ex := benchreport.Result{Bench: "store/exists_p99", Value: p99(r.existsUs), Unit: "us", Limit: p99(r.pingUs), LimitName: "empty Ping, same socket",
		Note: fmt.Sprintf("BatchExists of %d keys in L2, %d calls interleaved with as many Pings; p50 %.0f us (Ping %.0f us); ratio = Ping/exists (target: exists at most 2x)",
			o.batch, o.exists, r.existsUs[len(r.existsUs)/2], r.pingUs[len(r.pingUs)/2]), Target: 0.5}
	if ex.Value > 0 {
		ex.Ratio = ex.Limit / ex.Value
	}
	rows = append(rows, ex)
	cache := "page cache dropped before each get phase"
	if r.fileCold == 0 {
		cache = "page cache NOT dropped (not root, or --drop-caches=false): the file store's gets read what the page cache kept"
	}
	vsBytes := float64(r.vsPages) * float64(o.pageBytes)
	kv, file := vsBytes/(r.kvSet+r.kvGet)/1e9, vsBytes/(r.fileSet+r.fileGet)/1e9
	rows = append(rows, benchreport.Result{Bench: "store/vs-file", Value: kv, Unit: "GB/s", Target: 2,
		Note: fmt.Sprintf("%s; working set %d batches (%dx the slab) set, then %d seeded gets (half of them of the 2 batches set last); kvtier set %.2fs get %.2fs, file set %.2fs get %.2fs; %s; the file store keeps no fsync (as SGLang's file backend), kvtier's L3 is durable",
			geom, o.workBatches(), o.fileFactor, 4*o.workBatches(), r.kvSet, r.kvGet, r.fileSet, r.fileGet, cache)}.
		WithLimit("file-per-page store (temp file + rename, readinto), same disk", file))
	return rows
}

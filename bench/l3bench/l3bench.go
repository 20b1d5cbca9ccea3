// Package l3bench measures the L3 disk store: spill (Put until durable)
// and reload (Get with byte verification) throughput of full-size pages
// through l3disk, each against fio doing O_DIRECT transfers of the same
// block size at the same depth on the same file system in the same run.
// `kvtier bench l3` and `go test -bench` both call Run.
//
// It only measures: it never tunes the store or interprets a shortfall.
package l3bench

import (
	"github.com/kvtier/kvtier/internal/measure"

	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/indexes/badger"
	"github.com/kvtier/kvtier/indexes/lmdb"
	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/kvtier/kvtier/internal/crc32c"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l2hugetlb"
	"github.com/kvtier/kvtier/tiers/l3disk"
)

// Options configures a run.
type Options struct {
	// Dir is the file system under test: a temporary directory is made in
	// it for the slab files, the index and fio's file, and removed after.
	Dir string
	// PageBytes is the payload page size (default 2.75 MiB, an MLA page
	// of 512 tokens on one rank).
	PageBytes int64
	// Pages is the number of pages spilled and reloaded.
	Pages int
	// Batch is the number of pages per Put or Get call.
	Batch int
	// Depth is the store's reads and writes in flight, and fio's iodepth.
	Depth int
	// ODirect is the store's o_direct mode.
	ODirect string
	// ZeroCopy is the store's zero_copy mode (empty: the store's
	// default, auto).
	ZeroCopy string
	// Index is "lmdb" or "badger".
	Index string
	// Fio is the fio binary; empty looks "fio" up in PATH, "-" skips fio.
	Fio string
	// Logger receives the store's logs; nil discards.
	Logger *slog.Logger
	// Seed makes the page contents.
	Seed uint64
	// Sums hands every Put the producer's CRC-32C of its page
	// (PutRequest.Sum), as the host Node carries the host pool's copy's
	// and the store door a Commit's: the store writes it as given instead
	// of reading the page for its own. The bench takes it where it writes
	// the page, outside the spill's timer like the page's bytes.
	Sums bool
	// Rounds is how many times both the store and fio run, interleaved;
	// the median of each side counts (a shared machine makes single
	// rounds noisy, and a best-of would reward one side's lucky burst).
	Rounds int
}

// DefaultOptions returns 256 pages of 2.75 MiB in batches of 32, depth 8,
// over LMDB, in the system temporary directory.
func DefaultOptions() Options {
	return Options{
		Dir: os.TempDir(), PageBytes: 2883584, Pages: 256, Batch: 32, Depth: 8,
		ODirect: l3disk.ODirectAuto, Index: "lmdb", Seed: 1, Rounds: 5,
	}
}

// Target is the ratio to fio the store aims for in both directions.
const Target = 0.85

const mib = 1 << 20

// Run measures spill and reload and returns them with their fio limits.
func Run(ctx context.Context, o Options) (res []benchreport.Result, err error) {
	if o.PageBytes <= 0 || o.Pages <= 0 || o.Batch <= 0 || o.Depth <= 0 || o.Rounds <= 0 {
		return nil, fmt.Errorf("l3 bench: page bytes, pages, batch and depth must be positive: %+v", o)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	tmp, err := os.MkdirTemp(o.Dir, "kvtier-bench-l3-")
	if err != nil {
		return nil, fmt.Errorf("l3 bench: %w", err)
	}
	defer func() { err = errors.Join(err, os.RemoveAll(tmp)) }()

	fio, fioErr := findFio(o.Fio)
	var fws, frs []float64
	fioRound := func() error {
		if fioErr != nil {
			return nil
		}
		w, rd, err := runFio(ctx, fio, filepath.Join(tmp, "fio.dat"), l3disk.SlotBytes(o.PageBytes), int64(o.Pages), o.Depth)
		fws, frs = append(fws, w), append(frs, rd)
		return err
	}
	var cpuSpill, cpuReload time.Duration
	var group float64
	var zc [2]int64
	spills, reloads, direct, err := runStore(ctx, o, filepath.Join(tmp, "store"), fioRound, &cpuSpill, &cpuReload, &group, &zc)
	if err != nil {
		return nil, err
	}
	// fio with an fdatasync after as many writes as the store made durable
	// per fdatasync on average: the same durability work, done fio's way
	// (fio waits for its writes before each sync; the store overlaps them).
	syncEvery := max(1, int(math.Round(group)))
	var fsyncs []float64
	if fioErr == nil {
		for range o.Rounds {
			w, err := runFioSyncedWrite(ctx, fio, filepath.Join(tmp, "fio.dat"), l3disk.SlotBytes(o.PageBytes), int64(o.Pages), o.Depth, syncEvery)
			if err != nil {
				return nil, err
			}
			fsyncs = append(fsyncs, w)
		}
	}
	perPage := func(d time.Duration) string {
		return fmt.Sprintf("%.0f µs", float64(d.Microseconds())/float64(o.Rounds*o.Pages))
	}
	spill, reload := measure.Median(spills), measure.Median(reloads)
	fw, fr := measure.Median(fws), measure.Median(frs)
	slot := l3disk.SlotBytes(o.PageBytes)
	note := fmt.Sprintf("%d pages of %.2f MiB (slot %d B), batch %d, depth %d, index %s, %s, median of %d rounds interleaved with fio",
		o.Pages, float64(o.PageBytes)/mib, slot, o.Batch, o.Depth, o.Index,
		map[bool]string{true: "O_DIRECT", false: "buffered+fdatasync (O_DIRECT refused)"}[direct], o.Rounds)
	note += fmt.Sprintf(", zero copy (no staging buffer) %d of %d writes and %d of %d reads", zc[0], o.Rounds*o.Pages, zc[1], o.Rounds*o.Pages)
	sums := ", the store takes each page's CRC-32C"
	if o.Sums {
		sums = ", each Put with the producer's CRC-32C (taken where the bench writes the page)"
	}
	sums += "; the first two batches written into the slab before the timer, later ones inside it while the other batch is written out"
	rs := benchreport.Result{Bench: "l3/spill", Value: spill, Unit: "MiB/s", Target: Target,
		Note: note + "; Put to last durable ack (data, fdatasync, index commit)" + sums + "; process CPU " + perPage(cpuSpill) + "/page"}
	rr := benchreport.Result{Bench: "l3/reload", Value: reload, Unit: "MiB/s", Target: Target,
		Note: note + "; Get calls only, byte verification outside the timer; process CPU " + perPage(cpuReload) + "/page"}
	if fioErr != nil {
		rs.Note += "; no limit measured (" + fioErr.Error() + ")"
		rr.Note += "; no limit measured (" + fioErr.Error() + ")"
		return []benchreport.Result{rs, rr}, nil
	}
	rs = rs.WithLimit(fmt.Sprintf("fio write direct=1 bs=%d iodepth=%d libaio", slot, o.Depth), fw)
	rr = rr.WithLimit(fmt.Sprintf("fio read direct=1 bs=%d iodepth=%d libaio", slot, o.Depth), fr)
	rsync := benchreport.Result{Bench: "l3/spill-same-syncs", Value: spill, Unit: "MiB/s",
		Note: fmt.Sprintf("the store's spill against fio issuing an fdatasync every %d writes, the store's average group commit (%.1f writes per fdatasync); informative, no target", syncEvery, group)}
	rsync = rsync.WithLimit(fmt.Sprintf("fio write direct=1 bs=%d iodepth=%d libaio fdatasync=%d", slot, o.Depth, syncEvery), measure.Median(fsyncs))
	return []benchreport.Result{rs, rr, rsync}, nil
}

// pageContent fills b with page i's bytes: a seeded pattern with the page
// number in the first and last 8 bytes, distinct per page.
func pageContent(b []byte, pattern []byte, i int) {
	copy(b, pattern)
	binary.LittleEndian.PutUint64(b, uint64(i)+1)
	binary.LittleEndian.PutUint64(b[len(b)-8:], ^uint64(i))
}

func pageKey(seed uint64, round, i int) tiers.Key {
	var h pagehash.Hash
	binary.LittleEndian.PutUint64(h[:], seed)
	binary.LittleEndian.PutUint64(h[8:], uint64(i))
	binary.LittleEndian.PutUint64(h[16:], uint64(round))
	h[31] = 0xB3
	return tiers.Key{Hash: h}
}

func openIndex(ctx context.Context, o Options, dir string) (indexes.Index, error) {
	env := indexes.Env{Logger: o.Logger, Dir: dir}
	switch o.Index {
	case "lmdb":
		c := lmdb.DefaultConfig()
		return lmdb.Open(ctx, env, c)
	case "badger":
		c := badger.DefaultConfig()
		return badger.Open(ctx, env, c)
	}
	return nil, fmt.Errorf("l3 bench: index %q: want lmdb or badger", o.Index)
}

// runStore spills and reloads o.Pages pages o.Rounds times through one
// store, deleting them between rounds and calling between() after each,
// and returns each round's rates in MiB/s of payload.
func runStore(ctx context.Context, o Options, tmp string, between func() error, cpuSpill, cpuReload *time.Duration, group *float64, zeroCopy *[2]int64) (spill, reload []float64, direct bool, err error) {
	ix, err := openIndex(ctx, o, filepath.Join(tmp, "index"))
	if err != nil {
		return nil, nil, false, fmt.Errorf("l3 bench: %w", err)
	}
	defer func() { err = errors.Join(err, ix.Close()) }()
	geom := tiers.PayloadGeometry{PageTokens: 512, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: o.PageBytes}}}
	stack := "bench" + strconv.Itoa(os.Getpid())
	env := tiers.Env{Logger: o.Logger, Payload: geom, WorldSize: 1, StackID: stack}
	// Two regions of Batch pages: one is gathered while the other fills.
	scfg := l2hugetlb.DefaultConfig()
	scfg.Size = quantity.Size(2 * int64(o.Batch) * o.PageBytes)
	scfg.Fallback = l2hugetlb.FallbackShm
	scfg.Name = stack
	scfg.Stale = l2hugetlb.StaleRemove
	slab, err := l2hugetlb.Open(ctx, env, scfg)
	if err != nil {
		return nil, nil, false, fmt.Errorf("l3 bench: slab: %w", err)
	}
	defer func() { err = errors.Join(err, slab.Close()) }()
	env.Slab, env.Index = slab, ix
	cfg := l3disk.DefaultConfig()
	cfg.Disks = []l3disk.Disk{{Dir: filepath.Join(tmp, "disk")}}
	// Room for every page below the GC start watermark: this measures
	// the write path, not eviction.
	cfg.Slots = int64(math.Ceil(float64(o.Pages)/cfg.GCStop)) + int64(o.Batch)
	cfg.Depth, cfg.ODirect, cfg.PLPProbes = o.Depth, o.ODirect, 0
	if o.ZeroCopy != "" {
		cfg.ZeroCopy = o.ZeroCopy
	}
	st, err := l3disk.Open(ctx, env, cfg)
	if err != nil {
		return nil, nil, false, fmt.Errorf("l3 bench: %w", err)
	}
	defer func() {
		zeroCopy[0], zeroCopy[1] = st.DirectTransfers()
		err = errors.Join(err, st.Close())
	}()
	direct = st.Direct()

	pattern := make([]byte, o.PageBytes)
	fillPattern(pattern, o.Seed)
	span := func(region, i int) tiers.Span {
		return tiers.Span{Offset: (int64(region*o.Batch) + int64(i)) * o.PageBytes, Length: o.PageBytes}
	}

	total := float64(o.Pages) * float64(o.PageBytes) / mib
	for round := range o.Rounds {
		// Spill.
		pendingGather := [2]int{}
		regionOf := map[tiers.BatchID]int{}
		type item struct {
			b tiers.BatchID
			i int
		}
		gathered := map[item]bool{}
		durable, failed := 0, 0
		var firstErr error
		drain := func() {
			for _, a := range st.DrainAcks(nil) {
				region := regionOf[a.Batch]
				it := item{a.Batch, a.Index}
				if (a.Stage == tiers.AckGathered || a.Stage == tiers.AckFailed) && !gathered[it] {
					// NB: a source is released once: by its gathered ack, or
					// by a failed ack that comes without one.
					gathered[it] = true
					pendingGather[region]--
				}
				switch a.Stage {
				case tiers.AckDurable:
					durable++
				case tiers.AckFailed:
					failed++
					if firstErr == nil {
						firstErr = a.Err
					}
				}
			}
		}
		wait := func(cond func() bool) error {
			deadline := time.Now().Add(5 * time.Minute)
			for !cond() {
				select {
				case <-st.AckReady():
				case <-time.After(time.Millisecond):
				case <-ctx.Done():
					return ctx.Err()
				}
				drain()
				if time.Now().After(deadline) {
					return fmt.Errorf("l3 bench: acks stalled")
				}
			}
			return nil
		}
		// fill writes a batch's pages into its region (the producer's
		// copy into the slab) and makes its Put requests.
		fill := func(batchNo int) ([]tiers.PutRequest, error) {
			region, base := batchNo%2, batchNo*o.Batch
			n := min(o.Batch, o.Pages-base)
			reqs := make([]tiers.PutRequest, n)
			for i := range n {
				sp := span(region, i)
				b, err := slab.Bytes(sp)
				if err != nil {
					return nil, err
				}
				pageContent(b, pattern, base+i)
				reqs[i] = tiers.PutRequest{Key: pageKey(o.Seed, round, base+i), Src: sp}
				if o.Sums {
					reqs[i].Sum, reqs[i].HasSum = crc32c.Checksum(b), true
				}
			}
			return reqs, nil
		}
		// The first two batches are written before the timer starts (the
		// slab's two regions are free); a later batch is written, inside
		// it, once its region's pages are gathered, while the other
		// region's are written out.
		var ready [2][]tiers.PutRequest
		for b := range min(2, (o.Pages+o.Batch-1)/o.Batch) {
			if ready[b], err = fill(b); err != nil {
				return nil, nil, direct, err
			}
		}
		t0, c0 := time.Now(), measure.ProcessCPU()
		batchNo := 0
		for base := 0; base < o.Pages; base += o.Batch {
			region := batchNo % 2
			if err := wait(func() bool { return pendingGather[region] <= 0 }); err != nil {
				return nil, nil, direct, err
			}
			n := min(o.Batch, o.Pages-base)
			reqs := ready[region]
			if batchNo >= 2 {
				if reqs, err = fill(batchNo); err != nil {
					return nil, nil, direct, err
				}
			}
			// NB: count the items before Put: its acks may arrive before
			// Put returns, and regionOf is only read by drain on this
			// goroutine afterwards.
			pendingGather[region] += n
			id, err := st.Put(ctx, reqs)
			if err != nil {
				return nil, nil, direct, fmt.Errorf("l3 bench: put: %w", err)
			}
			regionOf[id] = region
			batchNo++
		}
		if err := wait(func() bool { return durable+failed == o.Pages }); err != nil {
			return nil, nil, direct, err
		}
		spillDur := time.Since(t0)
		*cpuSpill += measure.ProcessCPU() - c0
		if failed > 0 {
			return nil, nil, direct, fmt.Errorf("l3 bench: %d of %d puts failed, first: %w", failed, o.Pages, firstErr)
		}

		// Reload, verifying every byte outside the timer.
		want := make([]byte, o.PageBytes)
		var reloadDur time.Duration
		for base := 0; base < o.Pages; base += o.Batch {
			n := min(o.Batch, o.Pages-base)
			reqs := make([]tiers.GetRequest, n)
			for i := range n {
				reqs[i] = tiers.GetRequest{Key: pageKey(o.Seed, round, base+i), Dst: span(0, i)}
			}
			results := make([]error, n)
			t, c := time.Now(), measure.ProcessCPU()
			if err := st.Get(ctx, reqs, results); err != nil {
				return nil, nil, direct, fmt.Errorf("l3 bench: get: %w", err)
			}
			reloadDur += time.Since(t)
			*cpuReload += measure.ProcessCPU() - c
			for i := range n {
				if results[i] != nil {
					return nil, nil, direct, fmt.Errorf("l3 bench: reload of page %d: %w", base+i, results[i])
				}
				got, err := slab.Bytes(reqs[i].Dst)
				if err != nil {
					return nil, nil, direct, err
				}
				pageContent(want, pattern, base+i)
				if !bytes.Equal(got, want) {
					return nil, nil, direct, fmt.Errorf("l3 bench: page %d reloaded with wrong bytes", base+i)
				}
			}
		}
		spill = append(spill, total/spillDur.Seconds())
		reload = append(reload, total/reloadDur.Seconds())
		keys := make([]tiers.Key, o.Pages)
		for i := range keys {
			keys[i] = pageKey(o.Seed, round, i)
		}
		if err := st.Delete(ctx, keys); err != nil {
			return nil, nil, direct, fmt.Errorf("l3 bench: delete round %d: %w", round, err)
		}
		if err := between(); err != nil {
			return nil, nil, direct, err
		}
	}
	if syncs, writes := st.SyncStats(); syncs > 0 {
		*group = float64(writes) / float64(syncs)
	}
	return spill, reload, direct, nil
}

func fillPattern(b []byte, seed uint64) {
	x := seed*0x9e3779b97f4a7c15 + 1
	for i := 0; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
}

func findFio(bin string) (string, error) {
	switch bin {
	case "-":
		return "", errors.New("fio disabled")
	case "":
		p, err := exec.LookPath("fio")
		if err != nil {
			return "", errors.New("fio not installed")
		}
		return p, nil
	}
	return bin, nil
}

// runFio measures sequential O_DIRECT writes (overwriting a laid-out
// file, as the store overwrites its preallocated slab) and reads of n
// blocks of bs at iodepth, and returns both in MiB/s.
func runFio(ctx context.Context, fio, file string, bs, n int64, depth int) (write, read float64, err error) {
	args := func(rw string) []string {
		return []string{
			"--name=kvtier-l3-" + rw, "--filename=" + file, "--size=" + strconv.FormatInt(bs*n, 10),
			"--bs=" + strconv.FormatInt(bs, 10), "--rw=" + rw, "--direct=1", "--ioengine=libaio",
			"--iodepth=" + strconv.Itoa(depth), "--overwrite=1", "--end_fsync=1",
			"--output-format=json", "--numjobs=1",
		}
	}
	one := func(rw string) (float64, error) {
		out, err := exec.CommandContext(ctx, fio, args(rw)...).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return 0, fmt.Errorf("l3 bench: fio %s: %w: %s", rw, err, bytes.TrimSpace(ee.Stderr))
			}
			return 0, fmt.Errorf("l3 bench: fio %s: %w", rw, err)
		}
		return parseFio(out, rw)
	}
	if write, err = one("write"); err != nil {
		return 0, 0, err
	}
	if read, err = one("read"); err != nil {
		return 0, 0, err
	}
	return write, read, nil
}

// runFioSyncedWrite is runFio's write with an fdatasync every syncEvery
// writes, in MiB/s.
func runFioSyncedWrite(ctx context.Context, fio, file string, bs, n int64, depth, syncEvery int) (float64, error) {
	args := []string{
		"--name=kvtier-l3-write-synced", "--filename=" + file, "--size=" + strconv.FormatInt(bs*n, 10),
		"--bs=" + strconv.FormatInt(bs, 10), "--rw=write", "--direct=1", "--ioengine=libaio",
		"--iodepth=" + strconv.Itoa(depth), "--overwrite=1", "--end_fsync=1",
		"--fdatasync=" + strconv.Itoa(syncEvery), "--output-format=json", "--numjobs=1",
	}
	out, err := exec.CommandContext(ctx, fio, args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return 0, fmt.Errorf("l3 bench: fio synced write: %w: %s", err, bytes.TrimSpace(ee.Stderr))
		}
		return 0, fmt.Errorf("l3 bench: fio synced write: %w", err)
	}
	return parseFio(out, "write")
}

// parseFio extracts the bandwidth of the job's read or write side from
// fio's JSON output, in MiB/s.
func parseFio(out []byte, rw string) (float64, error) {
	// NB: fio may print notes before the JSON object.
	if i := bytes.IndexByte(out, '{'); i > 0 {
		out = out[i:]
	}
	var doc struct {
		Jobs []struct {
			Read struct {
				BwBytes float64 `json:"bw_bytes"`
			} `json:"read"`
			Write struct {
				BwBytes float64 `json:"bw_bytes"`
			} `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return 0, fmt.Errorf("l3 bench: fio %s output: %w", rw, err)
	}
	if len(doc.Jobs) != 1 {
		return 0, fmt.Errorf("l3 bench: fio %s output has %d jobs, want 1", rw, len(doc.Jobs))
	}
	bw := doc.Jobs[0].Write.BwBytes
	if rw == "read" {
		bw = doc.Jobs[0].Read.BwBytes
	}
	if bw <= 0 {
		return 0, fmt.Errorf("l3 bench: fio %s reported no bandwidth", rw)
	}
	return bw / mib, nil
}

// FioReadWrite lays out file with fio's sequential O_DIRECT writes of n
// blocks of bs at iodepth and reads them back the same way, and returns
// both in bytes/s: the disk's limits for a store whose pages are bs. fio
// is the binary ("" for fio on PATH, "-" to refuse).
func FioReadWrite(ctx context.Context, fio, file string, bs, n int64, depth int) (write, read float64, err error) {
	bin, err := findFio(fio)
	if err != nil {
		return 0, 0, err
	}
	w, r, err := runFio(ctx, bin, file, bs, n, depth)
	return w * mib, r * mib, err
}

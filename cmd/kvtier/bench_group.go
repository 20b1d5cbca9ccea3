package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/host/consensus/tcpgroup"
	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/kvtier/kvtier/internal/measure"
	"github.com/prometheus/procfs"
	"github.com/spf13/cobra"
)

// groupBenchShape is the vector exchanged: 4 operation classes, 64 ok
// bits, 16 reload candidates, no digest (252 bytes on the wire), a busy
// tick of an 8-rank group.
var groupBenchShape = consensus.Shape{Classes: 4, OKBits: 64, Reloads: 16}

// groupBytesPerRankTick bounds the memory of one latency sample (8 bytes)
// plus the exchanged buffers amortised; doubled for the GC.
const groupBytesPerRankTick = 64

// groupMaxRanks bounds --ranks.
const groupMaxRanks = 256

// newBenchGroupCmd returns `kvtier group`.
func newBenchGroupCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "group [flags]",
		Short: "the rank group's tick exchange against a raw TCP all-gather",
		Long: `Times the TCP rank group (gRPC, rank 0 as hub) over loopback against a
hand-written all-gather of the same bytes over plain net.Conn with the
same hub topology, in alternating rounds of one run. Every rank is a
goroutine of this process with its own socket.`,
		Example: `  kvtier bench group
  kvtier bench group --json`,
	}
	fs := cmd.Flags()
	asJSON := fs.Bool("json", false, "print one JSON object per line")
	ranks := countFlag(fs, "ranks", 8, "`number` of ranks (goroutines, one socket each)")
	ticks := countFlag(fs, "ticks", 2000, "timed exchanges per round and transport")
	rounds := countFlag(fs, "rounds", 5, "alternating timed `rounds` per transport (samples of all rounds pooled)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		stdout := cmd.OutOrStdout()
		if fs.NArg() != 0 {
			return fmt.Errorf("bench group: unexpected arguments %v: %w", fs.Args(), errUsage)
		}
		m := machineOf(ctx)
		if err := checkRanges(
			flagRange{Flag: "ranks", Value: int64(*ranks), Min: 2, MinWhy: "a group of one exchanges nothing", Max: groupMaxRanks,
				MaxWhy: "a fixed bound: one goroutine and socket pair per rank, and a hub is meant for small groups"},
			roundsRange("rounds", int64(*rounds)),
			// NB: ranks and rounds are checked above, so the per-tick cost
			// below cannot overflow.
			m.memoryRange("ticks", int64(*ticks), 1, groupBytesPerRankTick*int64(max(min(*ranks, groupMaxRanks), 0))*int64(max(min(*rounds, maxRounds), 0)), 0, "tick"),
		); err != nil {
			return fmt.Errorf("bench group: %w: %w", err, errUsage)
		}
		var kv, raw []int64
		var kvCPU, rawCPU time.Duration
		for r := 0; r < *rounds; r++ {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("bench group: %w", err)
			}
			cpu0 := measure.ProcessCPU()
			k, err := timeTCPGroup(ctx, *ranks, *ticks, uint64(r))
			if err != nil {
				return fmt.Errorf("bench group: round %d: tcp group: %w", r, err)
			}
			cpu1 := measure.ProcessCPU()
			w, err := timeRawGather(ctx, *ranks, *ticks, uint64(r))
			if err != nil {
				return fmt.Errorf("bench group: round %d: raw all-gather: %w", r, err)
			}
			kvCPU, rawCPU = kvCPU+cpu1-cpu0, rawCPU+measure.ProcessCPU()-cpu1
			kv, raw = append(kv, k...), append(raw, w...)
		}
		// CPU per tick of the whole group (all ranks, set-up and warm-up
		// included): what the exchange costs, whatever the load.
		perTick := func(d time.Duration) float64 {
			return d.Seconds() * 1e6 / float64(*rounds*(*ticks+*ticks/9+1))
		}
		us := func(ns int64) float64 { return float64(ns) / 1e3 }
		load := loadNote()
		note := fmt.Sprintf("%d ranks, %d B per contribution, %d exchanges x %d rounds; latency of each rank's Exchange, all ranks pooled; ratio = raw/kvtier; %s, GOMAXPROCS %d",
			*ranks, groupWireLen(), *ticks, *rounds, load, runtime.GOMAXPROCS(0))
		var results []benchreport.Result
		for _, q := range []struct {
			name   string
			q      float64
			target float64
		}{{"p50", 0.50, 0.8}, {"p99", 0.99, 0.8}} {
			k, w := us(measure.Quantile(kv, q.q)), us(measure.Quantile(raw, q.q))
			n := note
			if q.name == "p99" {
				n += "; target p99 <= 1000 us"
			}
			results = append(results,
				benchreport.Result{Bench: "group/raw/" + q.name, Value: w, Unit: "us", Note: "hand-written all-gather over net.Conn, same hub topology; reference"},
				benchreport.Result{Bench: "group/tcp/" + q.name, Value: k, Unit: "us", Limit: w, LimitName: "raw tcp all-gather", Ratio: w / k, Target: q.target, Note: n},
			)
		}
		kc, rc := perTick(kvCPU), perTick(rawCPU)
		results = append(results,
			benchreport.Result{Bench: "group/raw/cpu", Value: rc, Unit: "cpu-us/tick", Note: "process CPU (user+system) per tick, all ranks; reference"},
			benchreport.Result{Bench: "group/tcp/cpu", Value: kc, Unit: "cpu-us/tick", Limit: rc, LimitName: "raw tcp all-gather", Ratio: rc / kc,
				Note: "process CPU (user+system) per tick, all ranks, set-up included; ratio = raw/kvtier; insensitive to waiting for a core"})
		return benchreport.Write(stdout, results, *asJSON)
	}
	return cmd
}

func groupWireLen() int {
	b, _ := consensus.AppendContribution(nil, consensus.Envelope{Size: 1}, consensus.NewContribution(1, groupBenchShape))
	return len(b)
}

// loadNote says how loaded the machine was: the 1-minute load average and
// the number of CPUs.
func loadNote() string {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return fmt.Sprintf("load unknown, %d CPUs", runtime.NumCPU())
	}
	la, err := fs.LoadAvg()
	if err != nil {
		return fmt.Sprintf("load unknown, %d CPUs", runtime.NumCPU())
	}
	return fmt.Sprintf("load average %.2f on %d CPUs", la.Load1, runtime.NumCPU())
}

// runRanks runs body for every rank in its own goroutine, body timing its
// own ticks, and returns all samples after dropping each rank's first
// tenth (connection set-up, warm-up).
func runRanks(n, ticks int, body func(rank int, samples []int64) error) ([]int64, error) {
	samples := make([][]int64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		samples[r] = make([]int64, ticks)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = body(r, samples[r])
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var all []int64
	for _, s := range samples {
		all = append(all, s[len(s)/10:]...)
	}
	return all, nil
}

func timeTCPGroup(ctx context.Context, n, ticks int, seed uint64) ([]int64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ms := make([]*tcpgroup.Member, n)
	for r := range ms {
		ms[r], err = tcpgroup.New(tcpgroup.Options{Group: 1, Stack: 1, Rank: r, Size: n, HubAddr: ln.Addr().String(), Listener: ln, Timeout: 10 * time.Second, Logger: quiet})
		if err != nil {
			return nil, err
		}
	}
	defer func() {
		for _, m := range ms {
			_ = m.Close()
		}
	}()
	total := ticks + ticks/9 + 1
	return runRanks(n, total, func(r int, samples []int64) error {
		rng := rand.New(rand.NewPCG(seed, uint64(r)))
		for t := range samples {
			c := consensus.RandomContribution(rng, uint64(t+1), groupBenchShape, consensus.Digest{})
			start := time.Now()
			if _, err := ms[r].Exchange(ctx, uint64(t+1), c); err != nil {
				return err
			}
			samples[t] = int64(time.Since(start))
		}
		return nil
	})
}

// timeRawGather is the limit: every rank but 0 writes the same encoded
// contribution to rank 0 over its own net.Conn (a 4-byte length, then the
// bytes); rank 0 reads one from each, and writes every rank a reply of the
// frontier's size. No decoding, no reduction: transport only.
func timeRawGather(ctx context.Context, n, ticks int, seed uint64) ([]int64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	peers := make([]net.Conn, n) // hub side, by rank
	dialed := make([]net.Conn, n)
	for r := 1; r < n; r++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return nil, err
		}
		var hello [4]byte
		binary.LittleEndian.PutUint32(hello[:], uint32(r))
		if _, err := c.Write(hello[:]); err != nil {
			return nil, err
		}
		dialed[r] = c
		a, err := ln.Accept()
		if err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(a, hello[:]); err != nil {
			return nil, err
		}
		peers[binary.LittleEndian.Uint32(hello[:])] = a
	}
	defer func() {
		for r := 1; r < n; r++ {
			dialed[r].Close()
			peers[r].Close()
		}
	}()
	stop := context.AfterFunc(ctx, func() {
		for r := 1; r < n; r++ {
			dialed[r].Close()
		}
	})
	defer stop()
	frame := func(c consensus.Contribution, rank int) []byte {
		b, _ := consensus.AppendContribution(make([]byte, 4, 4+groupWireLen()), consensus.Envelope{Group: 1, Stack: 1, Rank: rank, Size: n}, c)
		binary.LittleEndian.PutUint32(b, uint32(len(b)-4))
		return b
	}
	total := ticks + ticks/9 + 1
	return runRanks(n, total, func(r int, samples []int64) error {
		rng := rand.New(rand.NewPCG(seed, uint64(r)))
		in := make([]byte, 4+groupWireLen())
		if r != 0 {
			conn := dialed[r]
			for t := range samples {
				msg := frame(consensus.RandomContribution(rng, uint64(t+1), groupBenchShape, consensus.Digest{}), r)
				start := time.Now()
				if _, err := conn.Write(msg); err != nil {
					return err
				}
				if err := readFrame(conn, in); err != nil {
					return err
				}
				samples[t] = int64(time.Since(start))
			}
			return nil
		}
		// The hub reads every peer in parallel, as gRPC's server does.
		got := make(chan error, n)
		for t := range samples {
			msg := frame(consensus.RandomContribution(rng, uint64(t+1), groupBenchShape, consensus.Digest{}), 0)
			start := time.Now()
			for p := 1; p < n; p++ {
				go func() {
					buf := make([]byte, len(in))
					got <- readFrame(peers[p], buf)
				}()
			}
			for p := 1; p < n; p++ {
				if err := <-got; err != nil {
					return err
				}
			}
			for p := 1; p < n; p++ {
				if _, err := peers[p].Write(msg); err != nil {
					return err
				}
			}
			samples[t] = int64(time.Since(start))
		}
		return nil
	})
}

func readFrame(c net.Conn, buf []byte) error {
	if _, err := io.ReadFull(c, buf[:4]); err != nil {
		return err
	}
	n := int(binary.LittleEndian.Uint32(buf))
	if n > len(buf)-4 {
		return fmt.Errorf("frame of %d bytes, buffer %d", n, len(buf)-4)
	}
	_, err := io.ReadFull(c, buf[4:4+n])
	return err
}

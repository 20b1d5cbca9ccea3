// Package pluginbench measures what running a Store out of process costs:
// the same store (tiers/memstore) opened in process and behind the example
// plugin binary, both reading and writing 2.75 MiB pages in the same shared
// slab, measured in one run with their rounds interleaved. It backs `kvtier
// bench plugin` and the go test benchmarks of this package.
//
// It never decides anything about a cache; it only times Put (until every
// item is acknowledged durable) and Get calls.
package pluginbench

import (
	"github.com/kvtier/kvtier/internal/measure"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/kvtier/kvtier/internal/benchreport"
	"github.com/kvtier/kvtier/internal/slabfile"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/plugins/pluginhost"
	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/memstore"
)

// PageBytes is the benchmark's page: 2.75 MiB, a KV page of a large model.
const PageBytes = 2816 << 10

// Config is one benchmark run.
type Config struct {
	// Plugin is the path of the memstore example plugin binary.
	Plugin string
	// SlabDir is the tmpfs where the shared slab files go when the
	// hugetlbfs mount (/dev/hugepages) is missing or full.
	SlabDir string
	// BatchPages is the large batch size (default 128).
	BatchPages int
	// Rounds is the number of measured rounds of each large batch
	// measurement (default 10); 1-page measurements run 10x as many.
	Rounds int
	// Logger receives the plugin's logs; nil discards them.
	Logger *slog.Logger
}

func (c *Config) defaults() {
	if c.BatchPages == 0 {
		c.BatchPages = 128
	}
	if c.Rounds == 0 {
		c.Rounds = 10
	}
	if c.SlabDir == "" {
		c.SlabDir = "/dev/shm"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Pair is a store opened twice: in process and behind the plugin, over one
// slab.
type Pair struct {
	// Slab is the shared slab both stores read and write through.
	Slab tiers.Slab
	// InProc is the memstore opened in this process.
	InProc tiers.Store
	// Plugin is the memstore behind the plugin binary.
	Plugin   tiers.Store
	payload  tiers.PayloadGeometry
	batch    int
	nextSeed uint64
	// LastPutCall is how long the last PutRound's Put call took; the rest
	// of the round was waiting for the durable acks.
	LastPutCall time.Duration
}

// Open creates the slab (BatchPages pages) and both stores, each with room
// for BatchPages pages so steady-state rounds evict and reuse buffers.
func Open(ctx context.Context, cfg Config) (*Pair, error) {
	cfg.defaults()
	sum, err := pluginhost.FileSHA256(cfg.Plugin)
	if err != nil {
		return nil, err
	}
	slab, err := slabfile.Open(ctx, cfg.Logger, cfg.SlabDir, "bench-plugin", int64(cfg.BatchPages)*PageBytes, true)
	if err != nil {
		return nil, fmt.Errorf("bench plugin: %w", err)
	}
	payload := tiers.PayloadGeometry{PageTokens: 64, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: PageBytes}}}
	env := tiers.Env{Logger: cfg.Logger, Payload: payload, WorldSize: 1, StackID: "bench-plugin", Slab: slab, ColdStart: tiers.ColdStartClear}
	capacity := int64(cfg.BatchPages) * PageBytes
	in, err := memstore.Open(env, memstore.Config{Capacity: quantity.Size(capacity)})
	if err != nil {
		slab.Close()
		return nil, fmt.Errorf("bench plugin: in-process memstore: %w", err)
	}
	pl, err := pluginhost.OpenStore(ctx, env, pluginhost.PluginSpec{
		Name: "bench-memstore", Path: cfg.Plugin, SHA256: sum,
		Config: map[string]any{"capacity": capacity},
	})
	if err != nil {
		in.Close()
		slab.Close()
		return nil, fmt.Errorf("bench plugin: %w", err)
	}
	p := &Pair{Slab: slab, InProc: in, Plugin: pl, payload: payload, batch: cfg.BatchPages}
	// Fault in the slab on both sides and fill both stores once.
	for range 2 {
		for _, st := range []tiers.Store{in, pl} {
			if _, err := p.PutRound(ctx, st, p.Keys(cfg.BatchPages)); err != nil {
				p.Close()
				return nil, err
			}
		}
	}
	return p, nil
}

// Close closes both stores and removes the slab.
func (p *Pair) Close() error {
	return errors.Join(p.Plugin.Close(), p.InProc.Close(), p.Slab.Close())
}

// Keys returns n fresh page keys (never stored before in this run).
func (p *Pair) Keys(n int) []tiers.Key {
	keys := make([]tiers.Key, n)
	for i := range keys {
		p.nextSeed++
		var tok [2]uint32
		tok[0], tok[1] = uint32(p.nextSeed), uint32(p.nextSeed>>32)
		keys[i] = tiers.Key{Hash: pagehash.Next(pagehash.Root, tok[:])}
	}
	return keys
}

func (p *Pair) span(i int) tiers.Span {
	return tiers.Span{Slab: 0, Offset: int64(i) * PageBytes, Length: PageBytes}
}

// PutRound puts keys from slab pages 0.. as one batch and waits until every
// item is acknowledged durable; it returns the elapsed time.
func (p *Pair) PutRound(ctx context.Context, st tiers.Store, keys []tiers.Key) (time.Duration, error) {
	reqs := make([]tiers.PutRequest, len(keys))
	for i, k := range keys {
		reqs[i] = tiers.PutRequest{Key: k, Src: p.span(i)}
	}
	start := time.Now()
	id, err := st.Put(ctx, reqs)
	if err != nil {
		return 0, fmt.Errorf("bench put: %w", err)
	}
	p.LastPutCall = time.Since(start)
	left := len(keys)
	var acks []tiers.Ack
	timeout := time.NewTimer(time.Minute)
	defer timeout.Stop()
	for left > 0 {
		acks = st.DrainAcks(acks[:0])
		for _, a := range acks {
			if a.Batch != id {
				continue
			}
			switch a.Stage {
			case tiers.AckDurable:
				left--
			case tiers.AckFailed:
				return 0, fmt.Errorf("bench put batch %d item %d failed: %w", id, a.Index, a.Err)
			}
		}
		if left == 0 {
			break
		}
		select {
		case <-st.AckReady():
		case <-timeout.C:
			return 0, fmt.Errorf("bench put batch %d: %d items without a durable ack after a minute", id, left)
		}
	}
	return time.Since(start), nil
}

// GetRound reads keys into slab pages 0.. as one batch; every item must hit.
func (p *Pair) GetRound(ctx context.Context, st tiers.Store, keys []tiers.Key) (time.Duration, error) {
	reqs := make([]tiers.GetRequest, len(keys))
	for i, k := range keys {
		reqs[i] = tiers.GetRequest{Key: k, Dst: p.span(i)}
	}
	res := make([]error, len(keys))
	start := time.Now()
	if err := st.Get(ctx, reqs, res); err != nil {
		return 0, fmt.Errorf("bench get: %w", err)
	}
	d := time.Since(start)
	for i, r := range res {
		if r != nil {
			return 0, fmt.Errorf("bench get item %d: %w", i, r)
		}
	}
	return d, nil
}

// Run measures, interleaving in-process and plugin rounds so that load on
// the machine hits both alike, and returns the figures.
func Run(ctx context.Context, cfg Config) ([]benchreport.Result, error) {
	cfg.defaults()
	p, err := Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	type series struct {
		in, pl, inAck, plAck []time.Duration
		// CPU time of the rounds: the host process for in-process
		// rounds; the host and the plugin process for plugin rounds.
		inCPU, plCPU time.Duration
	}
	pid := p.Plugin.(interface{ PID() int }).PID()
	runSeries := func(batch, rounds int, get bool) (series, error) {
		var s series
		for r := range rounds {
			keys := p.Keys(batch)
			order := []tiers.Store{p.InProc, p.Plugin}
			if r%2 == 1 {
				order = []tiers.Store{p.Plugin, p.InProc}
			}
			for _, st := range order {
				host0 := measure.ProcessCPU()
				plug0, err := measure.PidCPU(pid)
				if err != nil {
					return s, err
				}
				d, err := p.PutRound(ctx, st, keys)
				if err != nil {
					return s, err
				}
				if st == p.InProc {
					s.inAck = append(s.inAck, d-p.LastPutCall)
				} else {
					s.plAck = append(s.plAck, d-p.LastPutCall)
				}
				if get {
					if d, err = p.GetRound(ctx, st, keys); err != nil {
						return s, err
					}
				}
				plug1, err := measure.PidCPU(pid)
				if err != nil {
					return s, err
				}
				cpu := measure.ProcessCPU() - host0
				if st == p.InProc {
					s.in = append(s.in, d)
					s.inCPU += cpu
				} else {
					s.pl = append(s.pl, d)
					s.plCPU += cpu + plug1 - plug0
				}
			}
		}
		return s, nil
	}
	var out []benchreport.Result
	note := fmt.Sprintf("pages of %.2f MiB, memstore in process vs behind the plugin, same slab, %%d rounds interleaved", float64(PageBytes)/(1<<20))
	for _, op := range []string{"put", "get"} {
		big, err := runSeries(cfg.BatchPages, cfg.Rounds, op == "get")
		if err != nil {
			return nil, err
		}
		bytes := float64(cfg.BatchPages) * PageBytes
		in := bytes / measure.Quantile(big.in, 0.5).Seconds() / 1e9
		pl := bytes / measure.Quantile(big.pl, 0.5).Seconds() / 1e9
		out = append(out, benchreport.Result{
			Bench: fmt.Sprintf("plugin/%s-throughput-%dp", op, cfg.BatchPages), Value: pl, Unit: "GB/s",
			Target: 0.9, Note: fmt.Sprintf(note, cfg.Rounds) + "; median round",
		}.WithLimit("in-process memstore", in))
		// The best round of each side: on a shared, loaded machine the
		// least-disturbed round is the closer view of what each path costs.
		bin := bytes / measure.Quantile(big.in, 0).Seconds() / 1e9
		bpl := bytes / measure.Quantile(big.pl, 0).Seconds() / 1e9
		out = append(out, benchreport.Result{
			Bench: fmt.Sprintf("plugin/%s-throughput-%dp-best", op, cfg.BatchPages), Value: bpl, Unit: "GB/s",
			Target: 0.9, Note: fmt.Sprintf(note, cfg.Rounds) + "; best round of each side",
		}.WithLimit("in-process memstore", bin))
		// CPU per byte moved: insensitive to how busy the machine is,
		// unlike wall time. A get round also includes its put.
		moved := float64(cfg.Rounds) * bytes / 1e9
		what := "put"
		if op == "get" {
			what = "put then get"
		}
		cpuIn, cpuPl := big.inCPU.Seconds()/moved, big.plCPU.Seconds()/moved
		cpuRes := benchreport.Result{
			Bench: fmt.Sprintf("plugin/%s-cpu-%dp", op, cfg.BatchPages), Value: cpuPl, Unit: "CPU-s/GB",
			Limit: cpuIn, LimitName: "in-process memstore",
			Note: fmt.Sprintf("CPU time of %s rounds (host + plugin process) per GB of pages; ratio is in-process/plugin (lower is better); plugin CPU has 10 ms resolution", what),
		}
		if cpuPl > 0 {
			cpuRes.Ratio = cpuIn / cpuPl
		}
		out = append(out, cpuRes)
		small, err := runSeries(1, 10*cfg.Rounds, op == "get")
		if err != nil {
			return nil, err
		}
		if op == "put" {
			// What the ack stream adds: from Put's return to the last
			// durable ack of a 1-page batch (memstore acks inside Put, so
			// in process this is only the drain).
			for _, q := range []struct {
				name string
				q    float64
			}{{"p50", 0.5}, {"p99", 0.99}} {
				out = append(out, benchreport.Result{
					Bench: "plugin/put-ack-delay-1p-" + q.name, Value: measure.Quantile(small.plAck, q.q).Seconds() * 1e6, Unit: "us",
					Note: fmt.Sprintf("from Put's return to the durable ack over the server-streaming ack RPC, %d rounds; in process (only a drain): %.3g us",
						len(small.plAck), measure.Quantile(small.inAck, q.q).Seconds()*1e6),
				})
			}
		}
		for _, c := range []struct {
			batch int
			s     series
		}{{1, small}, {cfg.BatchPages, big}} {
			for _, q := range []struct {
				name string
				q    float64
			}{{"p50", 0.5}, {"p99", 0.99}} {
				what := "put until durable"
				if op == "get" {
					what = "get call"
				}
				lin := measure.Quantile(c.s.in, q.q).Seconds() * 1e6
				lpl := measure.Quantile(c.s.pl, q.q).Seconds() * 1e6
				r := benchreport.Result{
					Bench: fmt.Sprintf("plugin/%s-latency-%dp-%s", op, c.batch, q.name), Value: lpl, Unit: "us",
					Note: fmt.Sprintf("%s, %d rounds; ratio is in-process/plugin (lower is better)", what, len(c.s.pl)),
				}
				r.Limit, r.LimitName = lin, "in-process memstore"
				if lpl > 0 {
					r.Ratio = lin / lpl
				}
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// FindOrBuild returns the memstore example plugin: dir/kvtier-plugin-memstore
// under bin/plugins of the working directory or next to the running
// executable, or, inside the kvtier source tree, a fresh build into tmp.
func FindOrBuild(tmp string) (string, error) {
	const name = "kvtier-plugin-memstore"
	var candidates []string
	if wd, err := os.Getwd(); err == nil {
		candidates = append(candidates, filepath.Join(wd, "bin", "plugins", name))
	}
	if exe, err := os.Executable(); err == nil {
		candidates = append(candidates, filepath.Join(filepath.Dir(exe), "plugins", name))
	}
	for _, c := range candidates {
		if st, err := os.Stat(c); err == nil && st.Mode().IsRegular() {
			return c, nil
		}
	}
	root, err := sourceRoot()
	if err != nil {
		return "", fmt.Errorf("find %s: not in %v, and cannot build it: %w (run `make plugins`)", name, candidates, err)
	}
	out := filepath.Join(tmp, name)
	cmd := exec.Command("go", "build", "-o", out, "./plugins/examples/memstore")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w\n%s", name, err, b)
	}
	return out, nil
}

// sourceRoot finds the kvtier module root above the working directory.
func sourceRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && slices.Contains(splitLines(b), "module github.com/kvtier/kvtier") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the kvtier source tree")
		}
		dir = parent
	}
}

func splitLines(b []byte) []string {
	var out []string
	start := 0
	for i, c := range b {
		if c == '\n' {
			out = append(out, string(b[start:i]))
			start = i + 1
		}
	}
	return append(out, string(b[start:]))
}

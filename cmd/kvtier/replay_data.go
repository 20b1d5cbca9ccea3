package main

import (
	"github.com/kvtier/kvtier/host/datareplay"
	"github.com/spf13/pflag"

	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/host/replay"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/workload"
)

// dataFlags are the flags of `kvtier replay --data`.
type dataFlags struct {
	data      bool
	dir       string
	requests  *int
	coldStart string
	store     string
	step      *int
}

func addDataFlags(fs *pflag.FlagSet) *dataFlags {
	d := &dataFlags{}
	fs.BoolVar(&d.data, "data", false, "replay with bytes through a whole tier stack (default: the built-in small-page stack; --config must then name a stack with a host L1 pool), every hit verified")
	fs.StringVar(&d.dir, "data-dir", "", "with --data and the built-in stack: `directory` for the slab files, L3 and its index (default: a temporary directory, removed at the end)")
	d.requests = countFlag(fs, "requests", 0, "with --data: replay only the first `number` requests (default: all)")
	fs.StringVar(&d.coldStart, "cold-start", "clear", "with --data: what the stores do with a previous run's data: clear or load")
	fs.StringVar(&d.store, "store", "", "with --data: the store tier that is L3 (default: the first store)")
	d.step = countFlag(fs, "step-requests", replay.DefaultStepRequests, "with --data: the most new `requests` an engine step admits, 1 to 65536 (fewer when their pages would not fit in L1); the Machine ticks twice a step, once to load the matched prefixes back into L1 and once after the inserts")
	return d
}

// runReplayData runs `kvtier replay --data`.
func runReplayData(ctx context.Context, fs *pflag.FlagSet, df *dataFlags, positional []string, configPath string, asJSON bool, stdout, stderr io.Writer) error {
	for _, f := range []string{"policy", "vs", "capacity", "sweep", "sweep-points", "plot", "parallel"} {
		if fs.Changed(f) {
			return fmt.Errorf("replay: --%s has no meaning with --data (the stack config sets the policy and the tier sizes): %w", f, errUsage)
		}
	}
	if *df.requests < 0 {
		return fmt.Errorf("replay: --requests %d: want 0 (all) or more: %w", *df.requests, errUsage)
	}
	if err := (flagRange{Flag: "step-requests", Value: int64(*df.step), Min: 1, MinWhy: "a step admits at least one request", Max: 1 << 16, MaxWhy: "a bound on one step's batch"}).check(); err != nil {
		return fmt.Errorf("replay: %w: %w", err, errUsage)
	}
	cold := tiers.ColdStart(df.coldStart)
	if cold != tiers.ColdStartClear && cold != tiers.ColdStartLoad {
		return fmt.Errorf("replay: --cold-start %q: want clear or load: %w", df.coldStart, errUsage)
	}
	cfg := datareplay.DataConfig{Dir: df.dir, ColdStart: cold, Requests: *df.requests, Store: df.store, StepRequests: *df.step}
	if cfg.Dir == "" {
		tmp, err := os.MkdirTemp("", "kvtier-replay-data-")
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		defer os.RemoveAll(tmp)
		cfg.Dir = tmp
	} else if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return fmt.Errorf("replay: --data-dir: %w", err)
	}
	if configPath != "" {
		text, err := os.ReadFile(configPath)
		if err != nil {
			return fmt.Errorf("replay: --config: %w", err)
		}
		cfg.YAML = string(text)
	}
	tr, err := loadTrace(positional)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if st, _, err := datareplay.LoadDataStack(cfg.YAML, cfg.Dir); err != nil {
		return fmt.Errorf("replay: %w", err)
	} else if pt := st.Payload.PageTokens; pt != workload.BlockTokens {
		return fmt.Errorf("replay: config page_tokens is %d, but replay maps one %d-token trace block to one page: set model.page_tokens: %d", pt, workload.BlockTokens, workload.BlockTokens)
	} else if !hasHostPool(st) {
		return fmt.Errorf("replay --data: the stack has no host L1 pool (a tier with role: pool, use: host): the simulated engine reads and writes its pages")
	}
	n := tr.Requests()
	if cfg.Requests > 0 && cfg.Requests < n {
		n = cfg.Requests
	}
	var bar *progressbar.ProgressBar
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		bar = progressbar.NewOptions64(int64(n),
			progressbar.OptionSetWriter(stderr),
			progressbar.OptionSetDescription("replay --data"),
			progressbar.OptionShowCount(),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish())
		last := 0
		cfg.Progress = func(done int) { _ = bar.Add(done - last); last = done }
	}
	res, err := datareplay.RunData(ctx, tr, cfg)
	if bar != nil {
		_ = bar.Finish()
	}
	if err != nil {
		return fmt.Errorf("replay --data %s: %w", tr.Name, err)
	}
	if asJSON {
		if err := json.NewEncoder(stdout).Encode(res); err != nil {
			return fmt.Errorf("replay: write json: %w", err)
		}
	} else if err := writeDataTable(stdout, tr, res); err != nil {
		return err
	}
	if res.WrongBytes != 0 {
		return fmt.Errorf("replay --data: %d wrong bytes in %d verified pages", res.WrongBytes, res.VerifiedPages)
	}
	return nil
}

func hasHostPool(st *config.Stack) bool {
	return slices.ContainsFunc(st.Tiers, func(t config.Tier) bool { return t.Role == config.RolePool && t.Use == "host" })
}

func writeDataTable(w io.Writer, tr *replay.Trace, r datareplay.DataResult) error {
	fmt.Fprintf(w, "trace %s: %d of %d requests, %d input tokens, data mode, policy %s\ngeometry: %s\n\n",
		tr.Name, r.Requests, tr.Requests(), r.InputTokens, r.Policy, r.Geometry)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "TIER\tHIT PAGES\tHIT TOKENS\tSHARE OF INPUT\tBYTES IN\t")
	in := map[string]int64{"l1": r.Bytes.L2ToL1, "l2": r.Bytes.L1ToL2 + r.Bytes.L3ToL2, "l3": r.Bytes.L2ToL3}
	for _, t := range []string{"l1", "l2", "l3"} {
		share := 0.0
		if r.InputTokens > 0 {
			share = 100 * float64(r.HitTokensByTier[t]) / float64(r.InputTokens)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f%%\t%d\t\n", t, r.HitPagesByTier[t], r.HitTokensByTier[t], share, in[t])
	}
	fmt.Fprintf(tw, "total\t\t%d\t%.2f%%\t\t\n", r.HitTokens, 100*r.HitRate)
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("replay: write table: %w", err)
	}
	fmt.Fprintf(w, "\nverified pages %d, wrong bytes %d; bytes l1->l2 %d, l2->l3 %d, l3->l2 %d, l2->l1 %d; skips %s; failed ops %s; %d steps, %d ticks in %.2fs\n",
		r.VerifiedPages, r.WrongBytes, r.Bytes.L1ToL2, r.Bytes.L2ToL3, r.Bytes.L3ToL2, r.Bytes.L2ToL1, formatCounts(r.Skips), formatCounts(r.FailedOps), r.Steps, r.Ticks, r.Seconds)
	return nil
}

// formatCounts prints counters by name as "name=value" pairs sorted by
// name and separated by spaces ("capacity=1 ttl=3"), or "none" when there
// are none: the text form of a map, which fmt's %v would print as Go
// syntax ("map[capacity:1]"). Zero counts are shown; JSON keeps the map.
func formatCounts(m map[string]int64) string {
	if len(m) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

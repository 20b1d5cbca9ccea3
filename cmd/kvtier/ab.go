package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"text/tabwriter"
	"time"

	"github.com/kvtier/kvtier/internal/abstat"
	"github.com/spf13/cobra"
)

// abMaxScrape bounds one /metrics body.
const abMaxScrape = 16 << 20

// newABCmd returns `kvtier ab`.
func newABCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ab (--metrics URL | --from FILE) [flags]",
		Short: "compare serve's shadow policies with the live one on live traffic (hit rates, confidence intervals, a verdict)",
		Long: `Compares the hit rates of serve's shadow policies (kvtier serve --shadow)
with the live policy's over a window: each policy at each live tier's
capacity, with a bootstrap confidence interval over the window's time
buckets (one bucket between two scrapes), and says which policy wins and
by how much.

With --metrics it scrapes URL (serve's /metrics) every --interval for
--window, and with --save keeps the scrapes in a samples file; --from
analyses such a file again.

examples:
  kvtier ab --metrics http://127.0.0.1:9400/metrics --window 10m --interval 15s --save ab.samples
  kvtier ab --from ab.samples --json`,
		Example: `  kvtier ab --metrics http://127.0.0.1:9464/metrics --window 10m --save scrapes.jsonl
  kvtier ab --from scrapes.jsonl --json`,
	}
	fs := cmd.Flags()
	url := fs.String("metrics", "", "serve's /metrics `URL` to scrape")
	from := fs.String("from", "", "analyse a samples `file` (written by --save) instead of scraping")
	window := fs.Duration("window", time.Minute, "with --metrics: how long to scrape")
	interval := fs.Duration("interval", 5*time.Second, "with --metrics: the time between scrapes (one bucket)")
	save := fs.String("save", "", "with --metrics: write the scrapes to this samples `file`")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	seed := fs.Uint64("seed", 1, "bootstrap seed")
	resamples := fs.Int("resamples", 2000, "bootstrap resamples")
	level := fs.Float64("level", 0.95, "confidence level of the intervals")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		stdout := cmd.OutOrStdout()
		stderr := cmd.ErrOrStderr()
		switch {
		case fs.NArg() > 0:
			return fmt.Errorf("ab: unexpected arguments %q: %w", fs.Args(), errUsage)
		case (*url == "") == (*from == ""):
			return fmt.Errorf("ab: name one of --metrics URL and --from FILE: %w", errUsage)
		case *from != "" && *save != "":
			return fmt.Errorf("ab: --save goes with --metrics: %w", errUsage)
		case *interval < 100*time.Millisecond || *window < 2**interval:
			return fmt.Errorf("ab: --interval %s, --window %s: want an interval of at least 100ms and a window of at least 2 intervals: %w", *interval, *window, errUsage)
		case *resamples < 100 || *resamples > 1_000_000:
			return fmt.Errorf("ab: --resamples %d: want 100..1000000: %w", *resamples, errUsage)
		case !(*level > 0.5 && *level < 1):
			return fmt.Errorf("ab: --level %v: want a value in (0.5, 1): %w", *level, errUsage)
		}
		var raw []byte
		if *from != "" {
			var err error
			if raw, err = readBounded(*from, 1<<30); err != nil {
				return fmt.Errorf("ab: %w", err)
			}
		} else {
			var err error
			if raw, err = scrapeWindow(ctx, *url, *window, *interval, stderr); err != nil {
				return fmt.Errorf("ab: %w", err)
			}
			if *save != "" {
				if err := os.WriteFile(*save, raw, 0o644); err != nil {
					return fmt.Errorf("ab: --save: %w", err)
				}
			}
		}
		scrapes, err := abstat.ParseSamples(raw)
		if err != nil {
			return fmt.Errorf("ab: %s: %w", sourceName(*from, *url), err)
		}
		rep, err := abstat.Analyse(scrapes, abstat.Options{Resamples: *resamples, Seed: *seed, Level: *level})
		if err != nil {
			return fmt.Errorf("ab: %s: %w", sourceName(*from, *url), err)
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			return enc.Encode(rep)
		}
		printAB(stdout, rep)
		return nil
	}
	return cmd
}

func sourceName(from, url string) string {
	if from != "" {
		return from
	}
	return url
}

// scrapeWindow scrapes url every interval for window and returns the
// samples file. A failed scrape is reported and skipped (its bucket merges
// into the next); the window ends early on ctx.
func scrapeWindow(ctx context.Context, url string, window, interval time.Duration, stderr io.Writer) ([]byte, error) {
	client := &http.Client{Timeout: min(interval, 10*time.Second)}
	var out []byte
	n, failed := 0, 0
	end := time.Now().Add(window)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		at := time.Now()
		body, err := scrapeOnce(ctx, client, url)
		if err != nil {
			failed++
			fmt.Fprintf(stderr, "kvtier ab: scrape at %s: %v\n", at.Format(time.TimeOnly), err)
			if n == 0 && failed >= 3 {
				return nil, fmt.Errorf("%s: the first 3 scrapes failed: %w", url, err)
			}
		} else {
			out = abstat.WriteScrape(out, at, body)
			n++
		}
		if !at.Add(interval).Before(end) {
			break
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(stderr, "kvtier ab: stopped early after %d scrapes\n", n)
			return out, nil
		case <-tick.C:
		}
	}
	return out, nil
}

func scrapeOnce(ctx context.Context, client *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %s", resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, abMaxScrape+1))
	if err != nil {
		return nil, err
	}
	if len(b) > abMaxScrape {
		return nil, fmt.Errorf("a body larger than %d bytes", abMaxScrape)
	}
	return b, nil
}

func printAB(w io.Writer, rep abstat.Report) {
	fmt.Fprintf(w, "window %s to %s: %d buckets, %.0f lookup tokens, live policy %s",
		rep.From.Format(time.DateTime), rep.To.Format(time.DateTime), rep.Buckets, rep.LookupTokens, rep.Live)
	if rep.Resets > 0 {
		fmt.Fprintf(w, " (%d buckets skipped: counters went back, serve restarted)", rep.Resets)
	}
	fmt.Fprintln(w)
	if len(rep.Dropped) > 0 {
		fmt.Fprintf(w, "left out (absent from part of the window): %v\n", rep.Dropped)
	}
	pct := int(100*rep.Level + 0.5)
	for _, tr := range rep.Tiers {
		fmt.Fprintf(w, "\ntier %s (%.0f pages)\n", tr.Tier, tr.Pages)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "policy\thit rate\t%d%% interval\tvs live\t%d%% interval\n", pct, pct)
		for _, p := range tr.Policies {
			name := p.Policy
			if p.Live {
				name += " (live)"
			}
			vs, vsi := "-", "-"
			if !p.Live && rep.Live != "" {
				vs = fmt.Sprintf("%+.2f pt", 100*p.VsLive.Value)
				vsi = fmt.Sprintf("%+.2f to %+.2f", 100*p.VsLive.Low, 100*p.VsLive.High)
			}
			fmt.Fprintf(tw, "%s\t%.2f%%\t%.2f to %.2f%%\t%s\t%s\n", name, 100*p.Rate.Value, 100*p.Rate.Low, 100*p.Rate.High, vs, vsi)
		}
		tw.Flush()
		fmt.Fprintf(w, "verdict: %s\n", tr.Verdict)
	}
}

// Package abstat compares the hit rates of serve's shadow policies over a
// window of /metrics scrapes (`kvtier ab`): it parses the scrapes, turns
// consecutive ones into time buckets, and puts a bootstrap confidence
// interval over those buckets on each policy's hit rate and on its
// difference from the live policy's.
//
// It reads kvtier_shadow_lookup_tokens_total,
// kvtier_shadow_hit_tokens_total{policy,tier},
// kvtier_shadow_live_policy{policy} and kvtier_shadow_capacity_pages{tier}
// (docs/serve.md). It imports nothing of the host.
package abstat

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ScrapeMark begins each scrape in a samples file, followed by the
// scrape's time in Unix milliseconds, then the scrape's text exposition.
const ScrapeMark = "# kvtier-ab scrape "

// MaxScrapes bounds the scrapes of one samples file; MaxSeries the shadow
// series of one scrape.
const (
	MaxScrapes = 100_000
	MaxSeries  = 4096
)

// ErrInput marks samples that cannot be analysed; the message names the
// scrape and line.
var ErrInput = errors.New("bad ab samples")

// Scrape is what one scrape says of the shadows.
type Scrape struct {
	// At is when the scrape was taken.
	At time.Time
	// Lookups is kvtier_shadow_lookup_tokens_total.
	Lookups float64
	// Hits maps "policy\x00tier" to kvtier_shadow_hit_tokens_total.
	Hits map[string]float64
	// Live is the live policy's name ("" if the scrape does not say).
	Live string
	// Pages maps a tier to its shadow capacity in pages.
	Pages map[string]float64
}

func seriesKey(policy, tier string) string { return policy + "\x00" + tier }

// ParseScrape reads one text exposition taken at at.
func ParseScrape(at time.Time, text []byte) (Scrape, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return Scrape{}, fmt.Errorf("%w: %v", ErrInput, err)
	}
	s := Scrape{At: at, Hits: map[string]float64{}, Pages: map[string]float64{}}
	lk := fams["kvtier_shadow_lookup_tokens_total"]
	if lk == nil || len(lk.Metric) != 1 || !counterLike(lk.Metric[0]) {
		return Scrape{}, fmt.Errorf("%w: no kvtier_shadow_lookup_tokens_total counter (is serve running with --shadow?)", ErrInput)
	}
	s.Lookups = valueOf(lk.Metric[0])
	if hf := fams["kvtier_shadow_hit_tokens_total"]; hf != nil {
		if len(hf.Metric) > MaxSeries {
			return Scrape{}, fmt.Errorf("%w: %d kvtier_shadow_hit_tokens_total series, at most %d", ErrInput, len(hf.Metric), MaxSeries)
		}
		for _, m := range hf.Metric {
			pol, tier := labelOf(m.GetLabel(), "policy"), labelOf(m.GetLabel(), "tier")
			if pol == "" || tier == "" || !counterLike(m) {
				return Scrape{}, fmt.Errorf("%w: a kvtier_shadow_hit_tokens_total series without policy and tier labels, or not a counter", ErrInput)
			}
			s.Hits[seriesKey(pol, tier)] = valueOf(m)
		}
	}
	if len(s.Hits) == 0 {
		return Scrape{}, fmt.Errorf("%w: no kvtier_shadow_hit_tokens_total series", ErrInput)
	}
	if lf := fams["kvtier_shadow_live_policy"]; lf != nil {
		for _, m := range lf.Metric {
			if valueOf(m) == 1 {
				s.Live = labelOf(m.GetLabel(), "policy")
			}
		}
	}
	if pf := fams["kvtier_shadow_capacity_pages"]; pf != nil {
		for _, m := range pf.Metric {
			s.Pages[labelOf(m.GetLabel(), "tier")] = valueOf(m)
		}
	}
	for k, v := range s.Hits {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return Scrape{}, fmt.Errorf("%w: hit tokens %v for %s", ErrInput, v, strings.ReplaceAll(k, "\x00", " at "))
		}
	}
	if s.Lookups < 0 || math.IsNaN(s.Lookups) || math.IsInf(s.Lookups, 0) {
		return Scrape{}, fmt.Errorf("%w: lookup tokens %v", ErrInput, s.Lookups)
	}
	return s, nil
}

// counterLike reports whether m carries a counter's value (typed, or
// untyped as a hand-written exposition may be).
func counterLike(m *dto.Metric) bool { return m.GetCounter() != nil || m.GetUntyped() != nil }

// valueOf returns m's value, whatever its type.
func valueOf(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return math.NaN()
}

func labelOf[L interface {
	GetName() string
	GetValue() string
}](ls []L, name string) string {
	for _, l := range ls {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// WriteScrape appends one scrape to a samples file's bytes.
func WriteScrape(dst []byte, at time.Time, text []byte) []byte {
	dst = append(dst, ScrapeMark...)
	dst = strconv.AppendInt(dst, at.UnixMilli(), 10)
	dst = append(dst, '\n')
	dst = append(dst, text...)
	if len(text) > 0 && text[len(text)-1] != '\n' {
		dst = append(dst, '\n')
	}
	return dst
}

// ParseSamples reads a samples file (scrapes, each after a ScrapeMark
// line). An error names the scrape and the line it starts on.
func ParseSamples(b []byte) ([]Scrape, error) {
	var (
		out   []Scrape
		cur   []byte
		at    time.Time
		start int
		in    bool
	)
	flush := func() error {
		if !in {
			return nil
		}
		s, err := ParseScrape(at, cur)
		if err != nil {
			return fmt.Errorf("scrape %d (line %d): %w", len(out)+1, start, err)
		}
		out = append(out, s)
		return nil
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		l := sc.Bytes()
		if rest, ok := bytes.CutPrefix(l, []byte(ScrapeMark)); ok {
			if err := flush(); err != nil {
				return nil, err
			}
			if len(out) >= MaxScrapes {
				return nil, fmt.Errorf("%w: more than %d scrapes", ErrInput, MaxScrapes)
			}
			ms, err := strconv.ParseInt(string(bytes.TrimSpace(rest)), 10, 64)
			if err != nil || ms < 0 {
				return nil, fmt.Errorf("%w: line %d: scrape time %q is not Unix milliseconds", ErrInput, line, rest)
			}
			at, start, in, cur = time.UnixMilli(ms), line, true, cur[:0]
			continue
		}
		if !in {
			if len(bytes.TrimSpace(l)) == 0 {
				continue
			}
			return nil, fmt.Errorf("%w: line %d: text before the first %q line", ErrInput, line, strings.TrimSpace(ScrapeMark))
		}
		cur = append(cur, l...)
		cur = append(cur, '\n')
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: line %d: %v", ErrInput, line+1, err)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

// Options tune Analyse.
type Options struct {
	// Resamples is the number of bootstrap resamples (default 2000).
	Resamples int
	// Seed seeds the resampling (the result is deterministic).
	Seed uint64
	// Level is the confidence level (default 0.95).
	Level float64
}

// Interval is a point estimate with its bootstrap interval.
type Interval struct {
	Value float64 `json:"value"`
	Low   float64 `json:"low"`
	High  float64 `json:"high"`
}

// PolicyRate is one policy's hit rate at one tier over the window.
type PolicyRate struct {
	Policy string   `json:"policy"`
	Live   bool     `json:"live"`
	Rate   Interval `json:"hit_rate"`
	// VsLive is this policy's hit rate minus the live policy's, paired
	// over the same resampled buckets (zero for the live policy).
	VsLive Interval `json:"vs_live"`
}

// TierReport is the comparison at one tier's capacity.
type TierReport struct {
	Tier     string       `json:"tier"`
	Pages    float64      `json:"capacity_pages"`
	Policies []PolicyRate `json:"policies"`
	// Winner is the policy of the highest hit rate; Margin its lead over
	// the live policy; Significant whether the interval of that lead
	// excludes 0 (false when the live policy leads).
	Winner      string   `json:"winner"`
	Margin      Interval `json:"margin_vs_live"`
	Significant bool     `json:"significant"`
	Verdict     string   `json:"verdict"`
}

// Report is Analyse's result.
type Report struct {
	From, To time.Time `json:"-"`
	Buckets  int       `json:"buckets"`
	Resets   int       `json:"counter_resets"`
	// Dropped names the series left out: absent from some buckets.
	Dropped      []string     `json:"series_left_out,omitempty"`
	LookupTokens float64      `json:"lookup_tokens"`
	Live         string       `json:"live_policy"`
	Level        float64      `json:"level"`
	Tiers        []TierReport `json:"tiers"`
}

// bucket is the movement of the counters between two scrapes.
type bucket struct {
	lookups float64
	hits    map[string]float64
}

// Analyse compares the policies over the scrapes (in time order).
func Analyse(scrapes []Scrape, o Options) (Report, error) {
	if o.Resamples <= 0 {
		o.Resamples = 2000
	}
	if o.Level <= 0 || o.Level >= 1 {
		o.Level = 0.95
	}
	if len(scrapes) < 3 {
		return Report{}, fmt.Errorf("%w: %d scrapes; the interval needs at least 3 (2 buckets)", ErrInput, len(scrapes))
	}
	scrapes = slices.Clone(scrapes)
	sort.SliceStable(scrapes, func(i, j int) bool { return scrapes[i].At.Before(scrapes[j].At) })
	rep := Report{From: scrapes[0].At, To: scrapes[len(scrapes)-1].At, Level: o.Level}
	var bs []bucket
	for i := 1; i < len(scrapes); i++ {
		a, b := scrapes[i-1], scrapes[i]
		if b.Live != "" {
			rep.Live = b.Live
		}
		// NB: a counter that went back means serve restarted between the
		// scrapes: that bucket's movement is unknown, so it is skipped.
		reset := b.Lookups < a.Lookups
		bk := bucket{lookups: b.Lookups - a.Lookups, hits: map[string]float64{}}
		for k, v := range b.Hits {
			prev, ok := a.Hits[k]
			switch {
			case !ok && a.Lookups == 0:
				// The series starts with the window, at zero.
			case !ok || v < prev:
				// A series that appears mid-window (a policy added by a
				// restart) or went back has no known start.
				reset = true
			}
			bk.hits[k] = v - prev
		}
		for k := range a.Hits {
			if _, ok := b.Hits[k]; !ok {
				reset = true
			}
		}
		if reset {
			rep.Resets++
			continue
		}
		if bk.lookups <= 0 {
			continue
		}
		for k, h := range bk.hits {
			if h > bk.lookups*1.000001 {
				return Report{}, fmt.Errorf("%w: between scrapes %d and %d, %s gained %v hit tokens of %v looked up", ErrInput, i, i+1, strings.ReplaceAll(k, "\x00", " at "), h, bk.lookups)
			}
		}
		bs = append(bs, bk)
		rep.LookupTokens += bk.lookups
	}
	rep.Buckets = len(bs)
	// NB: only series present in every bucket kept are compared; the
	// others (a policy added or removed by a restart) cover another
	// window.
	keys := map[string]bool{}
	if len(bs) > 0 {
		for k := range bs[0].hits {
			keys[k] = true
		}
	}
	for _, b := range bs[1:] {
		for k := range keys {
			if _, ok := b.hits[k]; !ok {
				delete(keys, k)
				rep.Dropped = append(rep.Dropped, strings.ReplaceAll(k, "\x00", " at "))
			}
		}
	}
	sort.Strings(rep.Dropped)
	if len(bs) < 2 {
		return Report{}, fmt.Errorf("%w: %d time buckets with lookups (of %d scrapes, %d counter resets); the interval needs at least 2", ErrInput, len(bs), len(scrapes), rep.Resets)
	}
	// Series by tier, policies sorted (the live one first).
	byTier := map[string][]string{}
	for k := range keys {
		pol, tier, _ := strings.Cut(k, "\x00")
		byTier[tier] = append(byTier[tier], pol)
	}
	tiers := make([]string, 0, len(byTier))
	for t := range byTier {
		tiers = append(tiers, t)
	}
	sort.Strings(tiers)
	last := scrapes[len(scrapes)-1]
	rng := rand.New(rand.NewPCG(o.Seed, 0xab))
	// One set of resampled bucket indices, shared by every series, so
	// that differences are paired.
	draws := make([][]int, o.Resamples)
	for r := range draws {
		draws[r] = make([]int, len(bs))
		for i := range draws[r] {
			draws[r][i] = rng.IntN(len(bs))
		}
	}
	for _, tier := range tiers {
		pols := byTier[tier]
		sort.Slice(pols, func(i, j int) bool {
			if (pols[i] == rep.Live) != (pols[j] == rep.Live) {
				return pols[i] == rep.Live
			}
			return pols[i] < pols[j]
		})
		tr := TierReport{Tier: tier, Pages: last.Pages[tier]}
		rate := func(pol string, idx []int) float64 {
			var h, l float64
			k := seriesKey(pol, tier)
			if idx == nil {
				for _, b := range bs {
					h, l = h+b.hits[k], l+b.lookups
				}
			} else {
				for _, i := range idx {
					h, l = h+bs[i].hits[k], l+bs[i].lookups
				}
			}
			return h / l
		}
		samples := make(map[string][]float64, len(pols))
		for _, pol := range pols {
			s := make([]float64, o.Resamples)
			for r, idx := range draws {
				s[r] = rate(pol, idx)
			}
			samples[pol] = s
		}
		for _, pol := range pols {
			pr := PolicyRate{Policy: pol, Live: pol == rep.Live, Rate: interval(rate(pol, nil), samples[pol], o.Level)}
			if rep.Live != "" && samples[rep.Live] != nil {
				d := make([]float64, o.Resamples)
				for r := range d {
					d[r] = samples[pol][r] - samples[rep.Live][r]
				}
				pr.VsLive = interval(rate(pol, nil)-rate(rep.Live, nil), d, o.Level)
			}
			tr.Policies = append(tr.Policies, pr)
		}
		best := tr.Policies[0]
		for _, p := range tr.Policies[1:] {
			if p.Rate.Value > best.Rate.Value {
				best = p
			}
		}
		tr.Winner, tr.Margin = best.Policy, best.VsLive
		switch {
		case rep.Live == "" || samples[rep.Live] == nil:
			tr.Verdict = fmt.Sprintf("%s has the highest hit rate, %.2f%% (the live policy is not among the series)", best.Policy, 100*best.Rate.Value)
		case best.Policy == rep.Live:
			tr.Verdict = fmt.Sprintf("the live policy %s leads at %.2f%%; no shadow beats it", rep.Live, 100*best.Rate.Value)
		case best.VsLive.Low > 0:
			tr.Significant = true
			tr.Verdict = fmt.Sprintf("%s wins: %+.2f points over the live %s (%.0f%% interval %+.2f to %+.2f)", best.Policy, 100*best.VsLive.Value, rep.Live, 100*o.Level, 100*best.VsLive.Low, 100*best.VsLive.High)
		default:
			tr.Verdict = fmt.Sprintf("%s leads the live %s by %+.2f points, but the %.0f%% interval (%+.2f to %+.2f) includes 0: no significant winner; watch longer", best.Policy, rep.Live, 100*best.VsLive.Value, 100*o.Level, 100*best.VsLive.Low, 100*best.VsLive.High)
		}
		rep.Tiers = append(rep.Tiers, tr)
	}
	return rep, nil
}

// interval returns the percentile interval of samples at level around v.
func interval(v float64, samples []float64, level float64) Interval {
	s := slices.Clone(samples)
	slices.Sort(s)
	q := func(p float64) float64 {
		i := int(math.Floor(p * float64(len(s)-1)))
		return s[max(0, min(len(s)-1, i))]
	}
	a := (1 - level) / 2
	return Interval{Value: v, Low: q(a), High: q(1 - a)}
}

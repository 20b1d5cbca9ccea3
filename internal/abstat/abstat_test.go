package abstat

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// expo renders one scrape's text exposition of the shadow metrics.
func expo(lookups float64, hits map[string]float64, live string) string {
	var b strings.Builder
	b.WriteString("# TYPE kvtier_shadow_lookup_tokens_total counter\n")
	fmt.Fprintf(&b, "kvtier_shadow_lookup_tokens_total %v\n", lookups)
	b.WriteString("# TYPE kvtier_shadow_hit_tokens_total counter\n")
	for k, v := range hits {
		pol, tier, _ := strings.Cut(k, "/")
		fmt.Fprintf(&b, "kvtier_shadow_hit_tokens_total{policy=%q,tier=%q} %v\n", pol, tier, v)
	}
	b.WriteString("# TYPE kvtier_shadow_live_policy gauge\n")
	for k := range hits {
		pol, _, _ := strings.Cut(k, "/")
		v := 0
		if pol == live {
			v = 1
		}
		fmt.Fprintf(&b, "kvtier_shadow_live_policy{policy=%q} %d\n", pol, v)
	}
	b.WriteString("# TYPE kvtier_shadow_capacity_pages gauge\nkvtier_shadow_capacity_pages{tier=\"l2\"} 1024\n")
	return b.String()
}

// samples builds a samples file of n scrapes 5 s apart in which each
// bucket looks up 10000 tokens and each policy hits rates[policy] of them,
// give or take noise (seeded).
func samples(t *testing.T, seed uint64, n int, rates map[string]float64, noise float64, resetAt int) []byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	var out []byte
	var lookups float64
	hits := map[string]float64{}
	for p := range rates {
		hits[p+"/l2"] = 0
	}
	for i := range n {
		if i == resetAt {
			lookups = 0
			for k := range hits {
				hits[k] = 0
			}
		}
		out = WriteScrape(out, time.UnixMilli(int64(1_700_000_000_000+5000*i)), []byte(expo(lookups, hits, "adaptive")))
		lookups += 10000
		common := rng.NormFloat64() * noise
		// NB: the policies in sorted order: a map's order would hand the
		// seeded draws to different policies in each run.
		for _, p := range slices.Sorted(maps.Keys(rates)) {
			hits[p+"/l2"] += 10000 * min(1, max(0, rates[p]+common+rng.NormFloat64()*noise/4))
		}
	}
	return out
}

func TestAnalyse(t *testing.T) {
	tests := []struct {
		name        string
		rates       map[string]float64
		noise       float64
		resetAt     int
		winner      string
		significant bool
		resets      int
	}{
		{"a clear winner", map[string]float64{"adaptive": 0.30, "slru": 0.36, "lru": 0.28}, 0.05, -1, "slru", true, 0},
		{"the live one leads", map[string]float64{"adaptive": 0.35, "slru": 0.30}, 0.05, -1, "adaptive", false, 0},
		{"a tie within noise", map[string]float64{"adaptive": 0.300, "lru": 0.3005}, 0.10, -1, "", false, 0},
		{"a restart mid-window is skipped", map[string]float64{"adaptive": 0.30, "slru": 0.36}, 0.05, 10, "slru", true, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const seed = 7
			sc, err := ParseSamples(samples(t, seed, 25, tc.rates, tc.noise, tc.resetAt))
			if err != nil {
				t.Fatal(err)
			}
			rep, err := Analyse(sc, Options{Seed: seed})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Tiers) != 1 || rep.Live != "adaptive" || rep.Resets != tc.resets {
				t.Fatalf("seed %d: report %+v", seed, rep)
			}
			tr := rep.Tiers[0]
			if tc.winner != "" && tr.Winner != tc.winner || tr.Significant != tc.significant {
				t.Fatalf("seed %d: winner %s significant %v, want %s %v (%s)", seed, tr.Winner, tr.Significant, tc.winner, tc.significant, tr.Verdict)
			}
			for _, p := range tr.Policies {
				if p.Rate.Low > p.Rate.Value || p.Rate.High < p.Rate.Value {
					t.Errorf("%s: interval %+v does not hold its value", p.Policy, p.Rate)
				}
				if want := tc.rates[p.Policy]; p.Rate.Value < want-0.05 || p.Rate.Value > want+0.05 {
					t.Errorf("%s: rate %v, built at %v", p.Policy, p.Rate.Value, want)
				}
			}
			if tr.Policies[0].Policy != "adaptive" || !tr.Policies[0].Live {
				t.Errorf("the live policy is not first: %+v", tr.Policies[0])
			}
			t.Log(tr.Verdict)
		})
	}
}

func TestBadSamples(t *testing.T) {
	good := string(samples(t, 1, 4, map[string]float64{"adaptive": 0.3}, 0, -1))
	tests := []struct {
		name, in, msg string
	}{
		{"text before the first mark", "hello\n" + good, "line 1: text before"},
		{"bad time", ScrapeMark + "yesterday\n" + expo(0, map[string]float64{"a/l2": 0}, "a"), `scrape time "yesterday"`},
		{"no lookup counter", ScrapeMark + "1\nkvtier_shadow_hit_tokens_total{policy=\"a\",tier=\"l2\"} 1\n", "no kvtier_shadow_lookup_tokens_total"},
		{"no hit series", ScrapeMark + "1\nkvtier_shadow_lookup_tokens_total 5\n", "no kvtier_shadow_hit_tokens_total"},
		{"not exposition", ScrapeMark + "1\n{{{\n", "scrape 1 (line 1)"},
		{"negative", ScrapeMark + "1\n" + expo(-5, map[string]float64{"a/l2": 0}, "a"), "lookup tokens -5"},
		{"too few scrapes", ScrapeMark + "1\n" + expo(0, map[string]float64{"a/l2": 0}, "a"), "1 scrapes"},
		{"more hits than lookups", ScrapeMark + "1\n" + expo(0, map[string]float64{"a/l2": 0}, "a") + ScrapeMark + "2\n" + expo(10, map[string]float64{"a/l2": 50}, "a") + ScrapeMark + "3\n" + expo(20, map[string]float64{"a/l2": 60}, "a"), "gained 50 hit tokens of 10"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := ParseSamples([]byte(tc.in))
			if err == nil {
				_, err = Analyse(sc, Options{})
			}
			if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %v, want ErrInput with %q", err, tc.msg)
			}
		})
	}
}

// FuzzParseSamples: any bytes give scrapes or ErrInput, never a panic, and
// Analyse of what parses gives a report or ErrInput.
func FuzzParseSamples(f *testing.F) {
	f.Add([]byte(ScrapeMark + "1\n" + expo(0, map[string]float64{"a/l2": 0}, "a")))
	f.Add([]byte(ScrapeMark + "x\n"))
	f.Add([]byte("# kvtier-ab scrape 5\nkvtier_shadow_lookup_tokens_total 1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		sc, err := ParseSamples(b)
		if err != nil {
			if !errors.Is(err, ErrInput) {
				t.Fatalf("error %v is not ErrInput", err)
			}
			return
		}
		if _, err := Analyse(sc, Options{Resamples: 20}); err != nil && !errors.Is(err, ErrInput) {
			t.Fatalf("analyse: error %v is not ErrInput", err)
		}
	})
}

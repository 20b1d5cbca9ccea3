package replay

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// DefaultCapacities is the capacity list of `kvtier replay` when none is
// given: 1M, 3M and 10M tokens, plus the infinite bound.
var DefaultCapacities = []int64{1_000_000, 3_000_000, 10_000_000, 0}

// ParseCapacities parses a comma-separated list of capacities in tokens:
// an integer with an optional decimal suffix K, M or G (10^3, 10^6, 10^9)
// or binary suffix Ki, Mi or Gi (2^10, 2^20, 2^30), fractions allowed
// with a suffix ("1.5M"), or "inf" for infinite capacity, returned as 0.
// Errors name the item and its position in the list.
func ParseCapacities(s string) ([]int64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("capacity list is empty")
	}
	var out []int64
	for i, item := range strings.Split(s, ",") {
		c, err := parseCapacity(strings.TrimSpace(item))
		if err != nil {
			return nil, fmt.Errorf("capacity list item %d %q: %w", i+1, item, err)
		}
		out = append(out, c)
	}
	return out, nil
}

func parseCapacity(s string) (int64, error) {
	switch strings.ToLower(s) {
	case "inf", "infinite", "infinity":
		return 0, nil
	case "":
		return 0, fmt.Errorf("empty capacity")
	}
	mult := 1.0
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"K", 1e3}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	if mult == 1 {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("want tokens as an integer, a number with K/M/G/Ki/Mi/Gi, or inf")
		}
		if v <= 0 {
			return 0, fmt.Errorf("capacity must be positive (use inf for infinite)")
		}
		return v, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("want tokens as an integer, a number with K/M/G/Ki/Mi/Gi, or inf")
	}
	tokens := v * mult
	if tokens < 1 || tokens > math.MaxInt64/2 {
		return 0, fmt.Errorf("capacity %g tokens out of range", tokens)
	}
	return int64(tokens), nil
}

// FormatCapacity prints tokens the way ParseCapacities reads them back:
// "inf", or a short decimal form such as "3M" when exact.
func FormatCapacity(tokens int64) string {
	switch {
	case tokens == 0:
		return "inf"
	case tokens%1_000_000_000 == 0:
		return strconv.FormatInt(tokens/1_000_000_000, 10) + "G"
	case tokens%1_000_000 == 0:
		return strconv.FormatInt(tokens/1_000_000, 10) + "M"
	case tokens%1_000 == 0:
		return strconv.FormatInt(tokens/1_000, 10) + "K"
	}
	return strconv.FormatInt(tokens, 10)
}

// SweepCapacities returns points capacities spaced evenly on a log scale
// from the trace's working set (unique blocks × 512 tokens) / 256 up to
// the working set, rounded to whole blocks and deduplicated; beyond the
// working set nothing is ever evicted.
func SweepCapacities(tr *Trace, points int) []int64 {
	ws := float64(tr.UniqueBlocks()) * 512
	if points < 2 {
		points = 2
	}
	lo := ws / 256
	var out []int64
	for i := range points {
		c := lo * math.Pow(ws/lo, float64(i)/float64(points-1))
		blocks := max(int64(c)/512, 1)
		if len(out) == 0 || out[len(out)-1] != blocks*512 {
			out = append(out, blocks*512)
		}
	}
	return out
}

package replay

import (
	"fmt"
	"math"
	"strings"

	"github.com/kvtier/kvtier/quantity"
)

// DefaultCapacities returns the capacity list of `kvtier replay` when none
// is given: 1M, 3M and 10M tokens, plus the infinite bound (0). Each call
// returns a fresh slice, so no caller can change another's default.
func DefaultCapacities() []int64 { return []int64{1_000_000, 3_000_000, 10_000_000, 0} }

// ParseCapacities parses a comma-separated list of capacities in tokens
// with the stack config's token syntax (quantity.ParseTokenList: "1M",
// "1.5M", "4096", "inf"), returning infinite capacity as 0. Errors name the
// item and its position in the list.
func ParseCapacities(s string) ([]int64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("capacity list is empty")
	}
	toks, err := quantity.ParseTokenList(s)
	if err != nil {
		return nil, fmt.Errorf("capacity list: %w", err)
	}
	out := make([]int64, len(toks))
	for i, t := range toks {
		switch {
		case t.IsInf():
			out[i] = 0
		case t <= 0:
			return nil, fmt.Errorf("capacity list item %d %q: capacity must be positive (use inf for infinite)", i+1, t)
		default:
			out[i] = int64(t)
		}
	}
	return out, nil
}

// FormatCapacity prints tokens the way ParseCapacities reads them back:
// "inf" for 0, else the config's short form such as "3M".
func FormatCapacity(tokens int64) string {
	if tokens == 0 {
		return "inf"
	}
	return quantity.Tokens(tokens).String()
}

// CapacityLabel prints tokens for a person: "inf" for 0, else a rounded
// short form such as "3M" or "121.97M" (quantity.Tokens.Human). Tables
// and plots print it; JSON keeps the exact integer and --capacity reads
// FormatCapacity's exact form.
func CapacityLabel(tokens int64) string {
	if tokens == 0 {
		return "inf"
	}
	return quantity.Tokens(tokens).Human()
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

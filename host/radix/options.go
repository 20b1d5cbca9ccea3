package radix

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxTiers is the most tiers a Residency can name.
const MaxTiers = 8

// Residency is the set of tiers that hold a node's pages: bit i set means
// tier L(i+1) (L1 = bit 0, L2 = bit 1, ...) has every page of the node.
type Residency uint8

// Residency bits of the first tiers.
const (
	// L1 is the device pool.
	L1 Residency = 1 << iota
	// L2 is the host slab.
	L2
	// L3 is the first store below the slab.
	L3
)

// Has reports whether tier (1-based, L1 = 1) holds the pages.
func (r Residency) Has(tier int) bool {
	return tier >= 1 && tier <= MaxTiers && r&(1<<(tier-1)) != 0
}

// String returns the tiers as "L1+L3", or "-" for none.
func (r Residency) String() string {
	if r == 0 {
		return "-"
	}
	var b strings.Builder
	for i := range MaxTiers {
		if r&(1<<i) != 0 {
			if b.Len() > 0 {
				b.WriteByte('+')
			}
			fmt.Fprintf(&b, "L%d", i+1)
		}
	}
	return b.String()
}

// Options configure a Tree.
type Options struct {
	// PageTokens is the number of tokens per page for keys given as
	// tokens. Keys given as page hashes (replay) do not use it.
	PageTokens int
	// Tiers is the number of tiers residency may name (1..MaxTiers).
	Tiers int
	// Residency is the residency given to pages created by Insert.
	Residency Residency
}

// DefaultOptions returns the options of the embedded default stack: pages
// of 512 tokens, three tiers, new pages resident in L1.
func DefaultOptions() Options {
	return Options{PageTokens: 512, Tiers: 3, Residency: L1}
}

// Validate reports the first invalid option.
func (o Options) Validate() error {
	if o.PageTokens <= 0 {
		return fmt.Errorf("radix options: page_tokens must be positive, got %d", o.PageTokens)
	}
	if o.Tiers < 1 || o.Tiers > MaxTiers {
		return fmt.Errorf("radix options: tiers must be in 1..%d, got %d", MaxTiers, o.Tiers)
	}
	if err := o.checkResidency(o.Residency); err != nil {
		return fmt.Errorf("radix options: insert residency: %w", err)
	}
	return nil
}

func (o Options) checkResidency(r Residency) error {
	if r == 0 {
		return fmt.Errorf("residency must name at least one tier")
	}
	if o.Tiers < MaxTiers && r>>o.Tiers != 0 {
		return fmt.Errorf("residency %s names a tier beyond the %d configured", r, o.Tiers)
	}
	return nil
}

// String returns the options as "page_tokens=512 tiers=3 residency=L1",
// which ParseOptions reads back as the same values.
func (o Options) String() string {
	return fmt.Sprintf("page_tokens=%d tiers=%d residency=%s", o.PageTokens, o.Tiers, o.Residency)
}

// ParseOptions reads the form String writes: space-separated key=value
// pairs page_tokens, tiers and residency (tiers joined by '+', e.g.
// L1+L2), each at most once; keys left out keep DefaultOptions' values.
// The result is validated.
func ParseOptions(s string) (Options, error) {
	o := DefaultOptions()
	seen := map[string]bool{}
	for _, f := range strings.Fields(s) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return o, fmt.Errorf("radix options %q: %q is not key=value", s, f)
		}
		if seen[k] {
			return o, fmt.Errorf("radix options %q: %s given twice", s, k)
		}
		seen[k] = true
		switch k {
		case "page_tokens", "tiers":
			n, err := strconv.Atoi(v)
			if err != nil {
				return o, fmt.Errorf("radix options %q: %s: %w", s, k, err)
			}
			if k == "tiers" {
				o.Tiers = n
			} else {
				o.PageTokens = n
			}
		case "residency":
			r, err := ParseResidency(v)
			if err != nil {
				return o, fmt.Errorf("radix options %q: %w", s, err)
			}
			o.Residency = r
		default:
			return o, fmt.Errorf("radix options %q: unknown key %q (known: page_tokens, tiers, residency)", s, k)
		}
	}
	if err := o.Validate(); err != nil {
		return o, err
	}
	return o, nil
}

// ParseResidency reads the form Residency.String writes: tiers L1..L8
// joined by '+', or "-" for none.
func ParseResidency(s string) (Residency, error) {
	if s == "-" {
		return 0, nil
	}
	var r Residency
	for _, t := range strings.Split(s, "+") {
		n, err := strconv.Atoi(strings.TrimPrefix(t, "L"))
		if !strings.HasPrefix(t, "L") || err != nil || n < 1 || n > MaxTiers {
			return 0, fmt.Errorf("residency %q: want tiers L1..L%d joined by '+', got %q", s, MaxTiers, t)
		}
		r |= 1 << (n - 1)
	}
	return r, nil
}

package control

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvtier/kvtier/policy"
)

// SkipReason is why the Machine did not do something it would have done.
// Every skip is counted (Stats) and logged at most once per interval per
// reason and place.
type SkipReason uint8

// The skip reasons.
const (
	// SkipCapacity: a bounded resource is full — L1 cannot admit the
	// hard deficit, the spill queue is at its cap, reloads in flight are
	// at their cap.
	SkipCapacity SkipReason = iota + 1
	// SkipExhausted: the L2 reservation does not fit even after evicting
	// every eligible victim.
	SkipExhausted
	// SkipUndrained: acks are still outstanding (a flush with ops in
	// flight or requests holding locks).
	SkipUndrained
	// SkipTTL: a held request outlived its reload's TTL.
	SkipTTL
	// SkipTierDown: the tier an op needs is down on some rank.
	SkipTierDown
	// SkipFailed: an op failed on some rank (ok-AND false): rolled back.
	SkipFailed
	// SkipWatermark: admission met the hard deficit but not the
	// free-room watermark (best effort).
	SkipWatermark
)

var skipNames = [...]string{"", "capacity", "exhausted", "undrained", "ttl", "tier_down", "failed", "watermark"}

// String returns the reason's name.
func (r SkipReason) String() string {
	if int(r) < len(skipNames) && r > 0 {
		return skipNames[r]
	}
	return fmt.Sprintf("skip(%d)", uint8(r))
}

// Skip is one decision not taken.
type Skip struct {
	// Reason is why.
	Reason SkipReason
	// Where names the decision: "l1 admit", "l2 reserve", "spill queue",
	// "reload", "flush", "backup", "spill", "load-back".
	Where string
	// Req, Node, Op and Pages describe what was skipped (zero when not
	// applicable).
	Req   ReqID
	Node  policy.NodeID
	Op    OpID
	Pages int
}

// String renders the skip on one line.
func (s Skip) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "skip %s at %s", s.Reason, s.Where)
	if s.Req != 0 {
		fmt.Fprintf(&b, " req=%d", s.Req)
	}
	if s.Node != 0 {
		fmt.Fprintf(&b, " node=%d", s.Node)
	}
	if s.Op != 0 {
		fmt.Fprintf(&b, " op=%d", s.Op)
	}
	if s.Pages != 0 {
		fmt.Fprintf(&b, " pages=%d", s.Pages)
	}
	return b.String()
}

// skip records s: it goes to Ready, its counter is bumped, and a line is
// logged unless the same reason and place logged within the interval.
func (m *Machine) skip(s Skip) {
	m.out.skips = append(m.out.skips, s)
	key := s.Reason.String() + " at " + s.Where
	m.counts[key]++
	m.log.Warn(key, "kvtier control: skipped", "reason", s.Reason.String(), "where", s.Where,
		"req", s.Req, "node", s.Node, "op", s.Op, "pages", s.Pages, "tick", m.tick)
}

// count bumps a counter of something that happened (not a skip).
func (m *Machine) count(c counter) { m.events[c]++ }

// Stats returns the counters of skips ("<reason> at <where>") and events,
// sorted by name, as "name=value" lines.
func (m *Machine) Stats() []string {
	all := make(map[string]uint64, len(m.counts)+len(counterNames))
	for k, v := range m.counts {
		all[k] = v
	}
	for c, v := range m.events {
		if v > 0 {
			all[counterNames[c]] += v
		}
	}
	keys := make([]string, 0, len(all))
	for k := range all {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = fmt.Sprintf("%s=%d", k, all[k])
	}
	return out
}

// Count returns one counter of Stats.
func (m *Machine) Count(key string) uint64 {
	if i := slices.Index(counterNames[:], key); i >= 0 {
		return m.events[i] + m.counts[key]
	}
	return m.counts[key]
}

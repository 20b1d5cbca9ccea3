package adaptive

import (
	"testing"

	"github.com/kvtier/kvtier/host/replay"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/policytest"
)

// BenchmarkReplay replays the shared trace at 3M tokens (skipped without
// it); kvtier bench radix --policy adaptive is the reported figure.
func BenchmarkReplay(b *testing.B) {
	reqs := policytest.SharedTrace(b, "mooncake_synthetic_trace.jsonl")
	tr, err := replay.Compile("mooncake", reqs)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		a, _ := New(policy.Options{})
		if _, err := replay.Run(tr, a, 3_000_000, nil); err != nil {
			b.Fatal(err)
		}
	}
}

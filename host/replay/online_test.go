package replay

import (
	"crypto/sha256"
	"testing"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/adaptive"
)

// TestOnlineEqualsRun feeds the generated trace request by request to an
// Online replay, under page keys of another form than BlockKey's (as
// serve's shadows see real page hashes), and checks that it reaches Run's
// result exactly, for every policy that needs no future, at three
// capacities.
func TestOnlineEqualsRun(t *testing.T) {
	tr := generated(t)
	reg := registry(t)
	if err := adaptive.Register(reg); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"lru", "slru", "s3fifo", "sieve", "adaptive"} {
		for _, capTokens := range []int64{200 * 512, 2000 * 512, 0} {
			mk := func() policy.Evictor {
				f, err := reg.Lookup(policy.EvictorV1, name)
				if err != nil {
					t.Fatal(err)
				}
				ev, err := f.Factory(policy.Options{})
				if err != nil {
					t.Fatal(err)
				}
				return ev
			}
			want, err := Run(tr, mk(), capTokens, nil)
			if err != nil {
				t.Fatal(err)
			}
			on, err := NewOnline("test", mk(), capTokens)
			if err != nil {
				t.Fatal(err)
			}
			var hits int64
			for i := range tr.Requests() {
				keys, input, _ := tr.Request(i)
				real := make([]pagehash.Hash, len(keys))
				for j := range keys {
					real[j] = sha256.Sum256(keys[j][:8])
				}
				h, err := on.Request(real, input, tr.output[i])
				if err != nil {
					t.Fatal(err)
				}
				hits += h
			}
			got := on.Result()
			if got.HitTokens != want.HitTokens || hits != want.HitTokens || got.Evictions != want.Evictions ||
				got.InputTokens != want.InputTokens || got.Requests != want.Requests || got.HitRate != want.HitRate {
				t.Errorf("%s at %d tokens: online %d hit tokens (%d summed), %d evictions, rate %v; run %d, %d, %v",
					name, capTokens, got.HitTokens, hits, got.Evictions, got.HitRate, want.HitTokens, want.Evictions, want.HitRate)
			}
		}
	}
	if _, err := NewOnline("bad", nil, -1); err == nil {
		t.Error("negative capacity accepted")
	}
}

// BenchmarkOnline replays the generated trace request by request through
// serve's default shadow set (adaptive live; slru, s3fifo, lru) at the demo
// stack's three tier capacities: the shadows' cost per request.
func BenchmarkOnline(b *testing.B) {
	tr := generated(b)
	reg := registry(b)
	if err := adaptive.Register(reg); err != nil {
		b.Fatal(err)
	}
	keys := make([][]pagehash.Hash, tr.Requests())
	for i := range keys {
		k, _, _ := tr.Request(i)
		keys[i] = make([]pagehash.Hash, len(k))
		for j := range k {
			keys[i][j] = sha256.Sum256(k[j][:8])
		}
	}
	b.ResetTimer()
	n := 0
	for b.Loop() {
		var ons []*Online
		for _, name := range []string{"adaptive", "slru", "s3fifo", "lru"} {
			for _, pages := range []int64{256, 1024, 13107} {
				f, _ := reg.Lookup(policy.EvictorV1, name)
				ev, _ := f.Factory(policy.Options{})
				on, err := NewOnline(name, ev, pages*BlockTokens)
				if err != nil {
					b.Fatal(err)
				}
				ons = append(ons, on)
			}
		}
		for i, k := range keys {
			for _, on := range ons {
				if _, err := on.Request(k, len(k)*BlockTokens, 0); err != nil {
					b.Fatal(err)
				}
			}
			_ = i
		}
		n += len(keys)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/request")
}

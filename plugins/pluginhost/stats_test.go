package pluginhost

import (
	"syscall"
	"testing"
	"time"

	"github.com/kvtier/kvtier/tiers"
)

// TestStatsCumulativeAcrossKill: the counters of a plugin process that is
// SIGKILLed survive its restart, whether or not the host read its stats
// before the kill (a memstore plugin comes back empty, with zero counters).
func TestStatsCumulativeAcrossKill(t *testing.T) {
	cases := []struct {
		name       string
		readBefore bool
		seed       uint64
	}{
		{"never read before the kill", false, 13},
		{"read before the kill", true, 14},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, fastOptions(), tc.seed)
			stored := h.pages(8)
			b := h.put(0, stored)
			h.drain(map[tiers.BatchID]int{b: 8}, 10*time.Second)
			for range 2 {
				if hits, _ := h.get(16, stored); hits != 8 {
					t.Fatalf("seed %d: %d of 8 hits", tc.seed, hits)
				}
			}
			if hits, _ := h.get(16, h.pages(4)); hits != 0 {
				t.Fatalf("seed %d: %d hits of pages never stored", tc.seed, hits)
			}
			want := tiers.StoreStats{Hits: 16, Misses: 4, Puts: 8}
			if tc.readBefore {
				if got := h.store.Stats(); got.Hits != want.Hits || got.Misses != want.Misses || got.Puts != want.Puts {
					t.Fatalf("seed %d: stats before the kill %+v, want counters of %+v", tc.seed, got, want)
				}
			}
			pid := h.store.PID()
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "restart after the kill", 20*time.Second, func() bool {
				p := h.store.PID()
				return p != 0 && p != pid
			})
			// The new process answers misses: its own counters start at 0.
			if hits, _ := h.get(16, stored[:2]); hits != 0 {
				t.Fatalf("seed %d: %d hits from an empty restarted memstore", tc.seed, hits)
			}
			want.Misses += 2
			got := h.store.Stats()
			if got.Hits != want.Hits || got.Misses != want.Misses || got.Puts != want.Puts || got.PutFailures != 0 {
				t.Fatalf("seed %d: stats after kill and restart %+v, want counters of %+v", tc.seed, got, want)
			}
			if got.Pages != 0 {
				t.Fatalf("seed %d: %d pages in a restarted memstore", tc.seed, got.Pages)
			}
		})
	}
}

func TestProcessCounters(t *testing.T) {
	cases := []struct {
		name           string
		reported, seen tiers.StoreStats
		want           tiers.StoreStats
	}{
		{"never reported", tiers.StoreStats{}, tiers.StoreStats{Hits: 5, Misses: 2, Puts: 3, PutFailures: 1},
			tiers.StoreStats{Hits: 5, Misses: 2, Puts: 3, PutFailures: 1}},
		{"reported more than seen", tiers.StoreStats{Hits: 9, Misses: 1, Corrupt: 1, Puts: 4, Evictions: 2, Pages: 7},
			tiers.StoreStats{Hits: 8, Misses: 1, Puts: 4},
			tiers.StoreStats{Hits: 9, Misses: 1, Corrupt: 1, Puts: 4, Evictions: 2}},
		{"seen more since the report", tiers.StoreStats{Hits: 3, Puts: 2, PutFailures: 1}, tiers.StoreStats{Hits: 10, Puts: 6, PutFailures: 2},
			tiers.StoreStats{Hits: 10, Puts: 6, PutFailures: 2}},
	}
	for _, tc := range cases {
		if got := processCounters(tc.reported, tc.seen); got != tc.want {
			t.Errorf("%s: %+v, want %+v (gauges are not counters)", tc.name, got, tc.want)
		}
	}
}

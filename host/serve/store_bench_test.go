package serve

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	spb "github.com/kvtier/kvtier/api/storev1"
)

// BenchmarkStoreExists measures BatchExists of one SGLang batch (128
// keys of 64 hex characters) over the unix socket against Ping, the empty
// call on the same socket, each as p50 and p99 over b.N calls: with every
// page in the slab (l2), and with every page only in the store (l3: one
// LMDB lookup per payload kind). Run:
//
//	go test -run '^$' -bench BenchmarkStoreExists -benchtime 5000x ./host/serve/
func BenchmarkStoreExists(b *testing.B) {
	ctx := context.Background()
	for _, mode := range []string{"ping", "exists-l2", "exists-l3"} {
		b.Run(mode, func(b *testing.B) {
			cfg := storeConfig(b.TempDir(), DoorStore)
			if mode == "exists-l3" {
				// A slab of 8 pages and 128 keys: all but the last few
				// are in the store only.
				cfg.StoreYAML = storeTestYAML
			} else {
				cfg.StoreYAML = strings.Replace(storeTestYAML, "size: 256KiB", "size: 8MiB", 1)
			}
			s, sock, _ := startWith(b, cfg)
			sc := dialStore(b, sock)
			sc.register(ctx)
			keys := keyList("ex", 128)
			for i := 0; i < len(keys); i += 8 {
				sc.set(ctx, keys[i:i+8]...)
				waitPuts(b, s)
			}
			q := &spb.ExistsRequest{Session: sc.reg.GetSession(), Keys: keys}
			r, err := sc.c.BatchExists(ctx, q)
			if err != nil || r.GetPresent() != 128 {
				b.Fatalf("exists: %v %v", r.GetPresent(), err)
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				if mode == "ping" {
					_, err = sc.c.Ping(ctx, &spb.PingRequest{})
				} else {
					_, err = sc.c.BatchExists(ctx, q)
				}
				lat = append(lat, time.Since(t0))
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
		})
	}
}

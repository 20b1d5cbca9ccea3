package redis

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// collector exports the store's counters to Prometheus, read at scrape
// time from the same atomics Stats reads (no second bookkeeping).
type collector struct {
	s                                  *Store
	hits, misses, corrupt, puts, fails *prometheus.Desc
}

func newCollector(s *Store, rank int) *collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("kvtier_redis_"+name, help, nil,
			prometheus.Labels{"rank": strconv.Itoa(rank), "mode": s.cfg.Mode})
	}
	return &collector{
		s:       s,
		hits:    d("get_hits_total", "Get items served with verified bytes."),
		misses:  d("get_misses_total", "Get items that missed (absent, unreachable, or failed verification)."),
		corrupt: d("get_corrupt_total", "Get misses whose value failed verification (foreign, torn or damaged)."),
		puts:    d("put_items_total", "Put items accepted."),
		fails:   d("put_failed_total", "Put items acknowledged failed (server down, full, not replicated, closed)."),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.hits, c.misses, c.corrupt, c.puts, c.fails} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	counter(c.hits, c.s.hits.Load())
	counter(c.misses, c.s.misses.Load())
	counter(c.corrupt, c.s.corrupt.Load())
	counter(c.puts, c.s.puts.Load())
	counter(c.fails, c.s.putFailures.Load())
}

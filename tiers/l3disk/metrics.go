package l3disk

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// collector exports the store's counters to Prometheus, read at scrape
// time from the same atomics Stats reads (no second bookkeeping).
type collector struct {
	s                                  *Store
	hits, misses, corrupt, puts, fails *prometheus.Desc
	evictions, writeErr, readErr       *prometheus.Desc
	idxErr, spill, reload, idxFull     *prometheus.Desc
	used, total, readOnly              *prometheus.Desc
	zeroCopy                           *prometheus.Desc
}

func newCollector(s *Store) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("kvtier_l3_"+name, help, labels,
			prometheus.Labels{"rank": strconv.Itoa(s.rank), "disk": strconv.Itoa(s.disk)})
	}
	return &collector{
		s:         s,
		hits:      d("get_hits_total", "Get items served with verified bytes."),
		misses:    d("get_misses_total", "Get items that missed (absent, stale or failed verification)."),
		corrupt:   d("get_corrupt_total", "Get misses that were verification or read failures."),
		puts:      d("put_durable_total", "Put items acknowledged durable."),
		fails:     d("put_failed_total", "Put items acknowledged failed."),
		evictions: d("gc_reclaimed_total", "Pages reclaimed by the writer's garbage collection."),
		writeErr:  d("write_errors_total", "Slot writes that failed."),
		readErr:   d("read_errors_total", "Slot reads that failed."),
		idxErr:    d("index_errors_total", "Index operations that failed."),
		idxFull:   d("index_full_total", "Times the index refused a put as full and GC took the pages then in use as the capacity (the index map is smaller than the slabs need)."),
		spill:     d("spill_bytes_total", "Payload bytes made durable."),
		reload:    d("reload_bytes_total", "Payload bytes served by gets."),
		zeroCopy:  d("zero_copy_total", "Page writes and verified reads that moved the payload straight between the disk and the slab span, with no staging buffer (zero_copy).", "op"),
		used:      d("slots_used", "Slots live or in flight.", "kind"),
		total:     d("slots_total", "Slots in the slab file.", "kind"),
		readOnly:  d("slab_read_only", "1 if the kind's slab turned read-only after a failed fdatasync.", "kind"),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.hits, c.misses, c.corrupt, c.puts, c.fails, c.evictions,
		c.writeErr, c.readErr, c.idxErr, c.idxFull, c.spill, c.reload, c.used, c.total, c.readOnly, c.zeroCopy} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := &c.s.st
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	counter(c.hits, st.hits.Load())
	counter(c.misses, st.misses.Load())
	counter(c.corrupt, st.corrupt.Load())
	counter(c.puts, st.puts.Load())
	counter(c.fails, st.putFailures.Load())
	counter(c.evictions, st.evicted.Load())
	counter(c.writeErr, st.writeErrors.Load())
	counter(c.readErr, st.readErrors.Load())
	counter(c.idxErr, st.indexErrors.Load()+st.gcIndexErrors.Load())
	counter(c.idxFull, st.indexFullCaps.Load())
	counter(c.spill, st.spillBytes.Load())
	counter(c.reload, st.reloadBytes.Load())
	ch <- prometheus.MustNewConstMetric(c.zeroCopy, prometheus.CounterValue, float64(st.directWrites.Load()), "write")
	ch <- prometheus.MustNewConstMetric(c.zeroCopy, prometheus.CounterValue, float64(st.directReads.Load()), "read")
	for k, f := range c.s.files {
		kind := c.s.env.Payload.Kinds[k].Name
		ch <- prometheus.MustNewConstMetric(c.used, prometheus.GaugeValue, float64(st.usedSlots[k].Load()), kind)
		ch <- prometheus.MustNewConstMetric(c.total, prometheus.GaugeValue, float64(f.sb.Slots), kind)
		ro := 0.0
		if f.readOnlyErr() != nil {
			ro = 1
		}
		ch <- prometheus.MustNewConstMetric(c.readOnly, prometheus.GaugeValue, ro, kind)
	}
}

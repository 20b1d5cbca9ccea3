package serve

import "github.com/prometheus/client_golang/prometheus"

// The page-store door's metrics (kvtier_store_*), from its counters at
// each scrape; nothing when the door is off.
var (
	mStoreExists   = d("kvtier_store_exists_calls_total", "BatchExists calls served by the store door.", prometheus.CounterValue)
	mStoreGet      = d("kvtier_store_get_pages_total", "Pages asked for by BatchGet, by outcome (hit_l2, hit_l3, miss, corrupt, timeout).", prometheus.CounterValue, "outcome")
	mStoreSet      = d("kvtier_store_set_pages_total", "Pages offered by BatchSet, by outcome (stored: committed; exists: deduplicated).", prometheus.CounterValue, "outcome")
	mStoreNoSpace  = d("kvtier_store_no_space_pages_total", "Gets and sets refused because every slab page was pinned, reserved or being written below.", prometheus.CounterValue)
	mStoreBytes    = d("kvtier_store_bytes_total", "Page bytes handed out by BatchGet (read) and committed (written).", prometheus.CounterValue, "direction")
	mStoreUsed     = d("kvtier_store_l2_used_pages", "Slab pages of the store door in use.", prometheus.GaugeValue)
	mStoreCap      = d("kvtier_store_l2_capacity_pages", "Slab pages of the store door.", prometheus.GaugeValue)
	mStoreEvicted  = d("kvtier_store_evicted_pages_total", "Slab pages evicted by the stack's policy.", prometheus.CounterValue)
	mStorePrefetch = d("kvtier_store_prefetch_pages_total", "Pages BatchExists with prefetch started reloading from L3 (started), or left there (skipped: no room, or too many loading).", prometheus.CounterValue, "outcome")
	mStoreSessions = d("kvtier_store_sessions", "Open store door sessions.", prometheus.GaugeValue)
	mStoreLeases   = d("kvtier_store_leases", "Open get and set leases.", prometheus.GaugeValue)
	mStoreLoading  = d("kvtier_store_reload_pages_inflight", "Slab pages held by reloads from the store in flight.", prometheus.GaugeValue)
	mStoreQuar     = d("kvtier_store_quarantined_pages", "Slab pages of expired reservations waiting a lease before reuse.", prometheus.GaugeValue)
	mStoreVerify   = d("kvtier_store_verify_failures_total", "Slab pages whose CRC32C check failed at BatchGet (answered as misses).", prometheus.CounterValue)
	mStorePutFail  = d("kvtier_store_write_through_failures_total", "Write-through put items to the store that failed.", prometheus.CounterValue)
	mStoreL3Pages  = d("kvtier_store_tier_pages", "Pages the store door's store tier holds.", prometheus.GaugeValue, "tier")
)

type storeCollector struct{ s *Server }

func (c storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []desc{mStoreExists, mStoreGet, mStoreSet, mStoreNoSpace, mStoreBytes, mStoreUsed, mStoreCap, mStoreEvicted, mStorePrefetch,
		mStoreSessions, mStoreLeases, mStoreLoading, mStoreQuar, mStoreVerify, mStorePutFail, mStoreL3Pages} {
		ch <- d.Desc
	}
}

func (c storeCollector) Collect(ch chan<- prometheus.Metric) {
	sd := c.s.store
	if sd == nil {
		return
	}
	emit := emitter(ch)
	st, g := sd.door.Snapshot(), sd.door.Gauges()
	emit(mStoreExists, float64(st.GetExistsCalls()))
	emit(mStoreGet, float64(st.GetHitPagesL2()), "hit_l2")
	emit(mStoreGet, float64(st.GetHitPagesL3()), "hit_l3")
	emit(mStoreGet, float64(st.GetMissPages()), "miss")
	emit(mStoreGet, float64(st.GetCorruptPages()), "corrupt")
	emit(mStoreGet, float64(st.GetTimeoutPages()), "timeout")
	emit(mStoreSet, float64(st.GetStoredPages()), "stored")
	emit(mStoreSet, float64(st.GetExistsPages()), "exists")
	emit(mStoreNoSpace, float64(st.GetNoSpacePages()))
	emit(mStoreBytes, float64(st.GetReadBytes()), "read")
	emit(mStoreBytes, float64(st.GetWrittenBytes()), "written")
	emit(mStoreUsed, float64(st.GetL2UsedPages()))
	emit(mStoreCap, float64(st.GetL2CapacityPages()))
	emit(mStoreEvicted, float64(st.GetEvictedPages()))
	emit(mStorePrefetch, float64(st.GetPrefetchPages()), "started")
	emit(mStorePrefetch, float64(st.GetPrefetchSkippedPages()), "skipped")
	emit(mStoreSessions, float64(g.Sessions))
	emit(mStoreLeases, float64(g.Leases))
	emit(mStoreLoading, float64(g.Loading))
	emit(mStoreQuar, float64(g.Quarantined))
	emit(mStoreVerify, float64(g.VerifyFailures))
	emit(mStorePutFail, float64(g.PutFailures))
	for _, s := range sd.st.Stores {
		emit(mStoreL3Pages, float64(s.Store.Stats().Pages), s.Name)
	}
}

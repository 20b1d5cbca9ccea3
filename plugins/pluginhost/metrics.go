package pluginhost

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Failure reasons, the "reason" label of kvtier_plugin_failures_total.
const (
	reasonCrash     = "crash"     // the process exited or the connection broke
	reasonTimeout   = "timeout"   // a call ran past its deadline
	reasonMalformed = "malformed" // a reply broke the protocol
	reasonStart     = "start"     // a restart attempt failed
)

// metrics are one plugin instance's metrics, labelled plugin and role.
type metrics struct {
	up          prometheus.Gauge
	breakerOpen prometheus.Gauge
	restarts    prometheus.Counter
	failures    *prometheus.CounterVec
	degraded    *prometheus.CounterVec
	calls       *prometheus.HistogramVec
	unregister  func()
}

func newMetrics(reg prometheus.Registerer, name, role string) (*metrics, error) {
	m := &metrics{
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvtier_plugin_up", Help: "1 while the plugin process is serving, 0 while it is down.",
		}),
		breakerOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvtier_plugin_breaker_open", Help: "1 while the restart circuit breaker is open.",
		}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvtier_plugin_restarts_total", Help: "Plugin processes restarted after a failure.",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvtier_plugin_failures_total", Help: "Plugin failures by reason (crash, timeout, malformed, start).",
		}, []string{"reason"}),
		degraded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvtier_plugin_degraded_items_total",
			Help: "Items served while the plugin was down or failing: get misses, failed puts, skipped deletes and touches, index misses and failed writes.",
		}, []string{"op"}),
		calls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvtier_plugin_call_seconds", Help: "Latency of calls to the plugin by method.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16),
		}, []string{"method"}),
	}
	for _, r := range []string{reasonCrash, reasonTimeout, reasonMalformed, reasonStart} {
		m.failures.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"plugin": name, "role": role}, reg)
	var registered []prometheus.Collector
	for _, c := range []prometheus.Collector{m.up, m.breakerOpen, m.restarts, m.failures, m.degraded, m.calls} {
		if err := wrapped.Register(c); err != nil {
			for _, r := range registered {
				wrapped.Unregister(r)
			}
			return nil, fmt.Errorf("plugin %s: register metrics: %w", name, err)
		}
		registered = append(registered, c)
	}
	m.unregister = func() {
		for _, r := range registered {
			wrapped.Unregister(r)
		}
	}
	return m, nil
}

func (m *metrics) observe(method string, start time.Time) {
	m.calls.WithLabelValues(method).Observe(time.Since(start).Seconds())
}

// errString renders an error for a log attribute.
func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

package badger

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtier/kvtier/indexes"
)

// Operations counted by the index metrics, as the "op" label.
const (
	opPut = iota
	opGet
	opDelete
	opDeleteIf
	opTouch
	opIterate
	opStats
	numOps
)

var opNames = [numOps]string{"put", "get", "delete", "delete_if", "touch", "iterate", "stats"}

// metrics are the index's Prometheus counters, resolved per operation at
// open so that counting a call is a few atomic adds.
type metrics struct {
	calls, entries, errs [numOps]prometheus.Counter
	full, corrupt        prometheus.Counter
}

// newMetrics builds the counters and registers them with reg when reg is
// not nil. A second index of this kind on the same registerer shares the
// already registered counters.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	labels := prometheus.Labels{"index": Name}
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvtier_index_calls_total", Help: "Index v1 calls (batches), by operation.", ConstLabels: labels,
	}, []string{"op"})
	entries := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvtier_index_entries_total", Help: "Keys or entries passed to Index v1 calls, by operation.", ConstLabels: labels,
	}, []string{"op"})
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvtier_index_errors_total", Help: "Index v1 calls that returned an error, by operation.", ConstLabels: labels,
	}, []string{"op"})
	full := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvtier_index_full_total", Help: "Write batches refused because the index is full.", ConstLabels: labels,
	})
	corrupt := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvtier_index_corrupt_records_total", Help: "Stored records that failed to decode and were treated as absent.", ConstLabels: labels,
	})
	if reg != nil {
		var err error
		if calls, err = registerOrReuse(reg, calls); err != nil {
			return nil, err
		}
		if entries, err = registerOrReuse(reg, entries); err != nil {
			return nil, err
		}
		if errs, err = registerOrReuse(reg, errs); err != nil {
			return nil, err
		}
		if full, err = registerOrReuse(reg, full); err != nil {
			return nil, err
		}
		if corrupt, err = registerOrReuse(reg, corrupt); err != nil {
			return nil, err
		}
	}
	m := &metrics{full: full, corrupt: corrupt}
	for op, name := range opNames {
		m.calls[op] = calls.WithLabelValues(name)
		m.entries[op] = entries.WithLabelValues(name)
		m.errs[op] = errs.WithLabelValues(name)
	}
	return m, nil
}

func registerOrReuse[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("register %s index metrics: %w", Name, err)
}

// done counts one call of op over n keys that returned *errp.
func (m *metrics) done(op, n int, errp *error) {
	m.calls[op].Inc()
	m.entries[op].Add(float64(n))
	if err := *errp; err != nil {
		m.errs[op].Inc()
		if errors.Is(err, indexes.ErrFull) {
			m.full.Inc()
		}
	}
}

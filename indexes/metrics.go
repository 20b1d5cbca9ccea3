package indexes

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Operations counted by Metrics, as the "op" label.
const (
	OpPut = iota
	OpGet
	OpDelete
	OpDeleteIf
	OpTouch
	OpIterate
	OpStats
	numOps
)

var opNames = [numOps]string{"put", "get", "delete", "delete_if", "touch", "iterate", "stats"}

// Metrics are an Index v1 implementation's Prometheus counters, the same
// for every implementation (labelled by index name), resolved per operation
// at open so that counting a call is a few atomic adds.
type Metrics struct {
	calls, entries, errs [numOps]prometheus.Counter
	full                 prometheus.Counter
	// Corrupt counts stored records that failed to decode.
	Corrupt prometheus.Counter
}

// NewMetrics builds the counters of the index called name and registers
// them with reg when reg is not nil. A second index of the same name on
// the same registerer shares the already registered counters.
func NewMetrics(reg prometheus.Registerer, name string) (*Metrics, error) {
	labels := prometheus.Labels{"index": name}
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
		if calls, err = registerOrReuse(reg, name, calls); err != nil {
			return nil, err
		}
		if entries, err = registerOrReuse(reg, name, entries); err != nil {
			return nil, err
		}
		if errs, err = registerOrReuse(reg, name, errs); err != nil {
			return nil, err
		}
		if full, err = registerOrReuse(reg, name, full); err != nil {
			return nil, err
		}
		if corrupt, err = registerOrReuse(reg, name, corrupt); err != nil {
			return nil, err
		}
	}
	m := &Metrics{full: full, Corrupt: corrupt}
	for op, name := range opNames {
		m.calls[op] = calls.WithLabelValues(name)
		m.entries[op] = entries.WithLabelValues(name)
		m.errs[op] = errs.WithLabelValues(name)
	}
	return m, nil
}

func registerOrReuse[C prometheus.Collector](reg prometheus.Registerer, name string, c C) (C, error) {
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
	return c, fmt.Errorf("register %s index metrics: %w", name, err)
}

// Done counts one call of op over n keys that returned *errp (use it
// deferred, with the address of the named error result).
func (m *Metrics) Done(op, n int, errp *error) {
	m.calls[op].Inc()
	m.entries[op].Add(float64(n))
	if err := *errp; err != nil {
		m.errs[op].Inc()
		if errors.Is(err, ErrFull) {
			m.full.Inc()
		}
	}
}

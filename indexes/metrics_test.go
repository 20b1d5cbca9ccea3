package indexes_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtier/kvtier/indexes"
)

func TestMetricsShareRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := indexes.NewMetrics(reg, "x")
	if err != nil {
		t.Fatal(err)
	}
	b, err := indexes.NewMetrics(reg, "x")
	if err != nil {
		t.Fatalf("second index of the same name on one registerer: %v", err)
	}
	if a.Corrupt != b.Corrupt {
		t.Error("second registration did not reuse the registered counters")
	}
	if _, err := indexes.NewMetrics(reg, "y"); err != nil {
		t.Fatalf("index of another name: %v", err)
	}
	var okErr error
	full := fmt.Errorf("put: %w", indexes.ErrFull)
	other := errors.New("boom")
	a.Done(indexes.OpPut, 3, &okErr)
	a.Done(indexes.OpPut, 2, &full)
	a.Done(indexes.OpGet, 1, &other)
	want := map[string]float64{
		`kvtier_index_calls_total{op="put"}`:   2,
		`kvtier_index_entries_total{op="put"}`: 5,
		`kvtier_index_errors_total{op="put"}`:  1,
		`kvtier_index_errors_total{op="get"}`:  1,
		`kvtier_index_full_total{op=""}`:       1,
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			op, index := "", ""
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "op":
					op = l.GetValue()
				case "index":
					index = l.GetValue()
				}
			}
			if index == "x" {
				got[fmt.Sprintf("%s{op=%q}", f.GetName(), op)] = m.GetCounter().GetValue()
			}
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

package policy

import (
	"math"
	"strings"
	"testing"
)

func TestRangeParam(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params map[string]float64
		want   float64
		err    string
	}{
		{"absent", nil, 0.5, ""},
		{"low edge", map[string]float64{"s": 0}, 0, ""},
		{"high edge", map[string]float64{"s": 2}, 2, ""},
		{"inside", map[string]float64{"s": 0.7}, 0.7, ""},
		{"negative", map[string]float64{"s": -0.1}, 0, "s -0.1 is outside [0, 2]"},
		{"above", map[string]float64{"s": 2.5}, 0, "s 2.5 is outside [0, 2]"},
		{"NaN", map[string]float64{"s": math.NaN()}, 0, "outside"},
	} {
		got, err := RangeParam(tc.params, "s", 0.5, 2)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err = %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: RangeParam = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

func TestCheckParams(t *testing.T) {
	if err := CheckParams("p", map[string]float64{"a": 1}, "a", "b"); err != nil {
		t.Fatal(err)
	}
	if err := CheckParams("p", map[string]float64{"c": 1}, "a", "b"); err == nil || !strings.Contains(err.Error(), `unknown parameter "c"`) {
		t.Fatalf("unknown parameter: %v", err)
	}
	// Several unknown parameters: the error names the same one every run
	// (the first in sorted order), whatever the map's iteration order.
	many := map[string]float64{}
	for _, k := range []string{"zeta", "mu", "alpha2", "omega", "beta"} {
		many[k] = 1
	}
	for range 50 {
		if err := CheckParams("p", many, "a"); err == nil || !strings.Contains(err.Error(), `unknown parameter "alpha2"`) {
			t.Fatalf("error %v does not name alpha2, the first unknown key in sorted order", err)
		}
	}
}

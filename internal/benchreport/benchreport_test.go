package benchreport

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestJSONKeys(t *testing.T) {
	rs := []Result{
		Result{Bench: "x/with-limit", Value: 8, Unit: "GB/s", Target: 0.8}.WithLimit("memcpy", 10),
		{Bench: "x/no-limit", Value: 3, Unit: "ms", Note: "no limit measured"},
	}
	var buf bytes.Buffer
	if err := Write(&buf, rs, true); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d JSON lines, want 2:\n%s", len(lines), buf.String())
	}
	var first, second map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &second); err != nil {
		t.Fatal(err)
	}
	// Scripts depend on these names.
	for _, k := range []string{"bench", "value", "unit", "limit", "ratio"} {
		if _, ok := first[k]; !ok {
			t.Errorf("result with a limit lacks key %q: %s", k, lines[0])
		}
	}
	if first["ratio"].(float64) != 0.8 {
		t.Errorf("ratio = %v, want value/limit = 0.8", first["ratio"])
	}
	if _, ok := second["limit"]; ok {
		t.Errorf("result without a limit has a limit key: %s", lines[1])
	}
}

func TestTable(t *testing.T) {
	var buf bytes.Buffer
	rs := []Result{Result{Bench: "l2/copy", Value: 20, Unit: "GB/s"}.WithLimit("slice copy", 25)}
	if err := Write(&buf, rs, false); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"BENCH", "l2/copy", "25 (slice copy)", "0.800x"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

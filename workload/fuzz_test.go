package workload

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
)

// FuzzReader feeds arbitrary bytes to the reader. It must never panic; every
// content error must be a *LineError naming a line that exists; and whatever
// it accepts must be valid JSON that encoding/json decodes to the same
// request, and must survive a Write/read round trip.
func FuzzReader(f *testing.F) {
	for _, s := range []string{
		`{"timestamp": 0, "input_length": 40160, "output_length": 6, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78]}`,
		`{"timestamp": 1, "input_length": 1, "output_length": 0, "hash_ids": [7]}` + "\n" + `{"timestamp": 0, "input_length": 1, "output_length": 0, "hash_ids": [7]}`,
		`{"timestamp": 1, "x": {"a": [1, "b", null]}, "input_length": 0, "output_length": 0, "hash_ids": []}`,
		`{"timestamp": 1.5}`,
		`{"timestamp": 12.5, "input_length": 1, "output_length": 0, "hash_ids": [9]}`,
		`{"\u0074imestamp": 1, "input_length": 513, "output_length": 0, "hash_ids": [1, 2]}`,
		"\r\n\n{}",
		`[`,
		`{"hash_ids": [1, -1]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		lines := bytes.Count(data, []byte("\n")) + 1
		r := NewReader(bytes.NewReader(data), "fuzz")
		var got []Request
		for {
			req, err := r.Next()
			if err != nil {
				var le *LineError
				if errors.As(err, &le) {
					if le.Line < 1 || le.Line > lines {
						t.Fatalf("error names line %d of %d: %v", le.Line, lines, err)
					}
					if !strings.HasPrefix(err.Error(), fmt.Sprintf("fuzz:%d", le.Line)) {
						t.Fatalf("error %q does not start with file:line", err)
					}
				}
				break
			}
			if err := req.Validate(); err != nil {
				t.Fatalf("accepted an invalid request: %v", err)
			}
			// Compare with encoding/json on the exact field names.
			line := nthLine(data, r.Line())
			if !json.Valid(line) {
				t.Fatalf("accepted invalid JSON on line %d: %q", r.Line(), line)
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(line, &m); err != nil {
				t.Fatalf("encoding/json refuses accepted line %q: %v", line, err)
			}
			var want Request
			for k, v := range m {
				var dst any
				var ts float64
				switch k {
				case "timestamp":
					dst = &ts
				case "input_length":
					dst = &want.InputLength
				case "output_length":
					dst = &want.OutputLength
				case "hash_ids":
					dst = &want.HashIDs
				default:
					continue
				}
				if err := json.Unmarshal(v, dst); err != nil {
					t.Fatalf("encoding/json refuses field %s of accepted line %q: %v", k, line, err)
				}
				if k == "timestamp" {
					// Exact for integers; fractions are floored. A float64
					// rounds integers above 2^53, so compare those loosely.
					want.Timestamp = req.Timestamp
					if d := math.Abs(math.Floor(ts) - float64(req.Timestamp)); d > math.Max(1, ts*1e-15) {
						t.Fatalf("line %q: timestamp %d, encoding/json reads %v", line, req.Timestamp, ts)
					}
				}
			}
			if len(want.HashIDs) == 0 {
				want.HashIDs = []uint64{}
			}
			if !reflect.DeepEqual(req, want) {
				t.Fatalf("line %q: got %+v, encoding/json says %+v", line, req, want)
			}
			got = append(got, req)
		}
		var buf bytes.Buffer
		if err := Write(&buf, got); err != nil {
			t.Fatalf("Write of accepted requests: %v", err)
		}
		back, err := NewReader(&buf, "again").ReadAll()
		if err != nil {
			t.Fatalf("reading back: %v", err)
		}
		if len(back) != len(got) || (len(got) > 0 && !reflect.DeepEqual(back, got)) {
			t.Fatalf("round trip changed the requests")
		}
	})
}

// nthLine returns line n (1-based) of data without its line ending.
func nthLine(data []byte, n int) []byte {
	for i := 1; i < n; i++ {
		j := bytes.IndexByte(data, '\n')
		data = data[j+1:]
	}
	if j := bytes.IndexByte(data, '\n'); j >= 0 {
		data = data[:j]
	}
	return bytes.TrimSuffix(data, []byte("\r"))
}

package workload

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

// sharedTrace returns the path of the published synthetic trace, skipping
// the test when ../shared is absent.
func sharedTrace(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	moduleRoot := filepath.Join(filepath.Dir(file), "..")
	p := filepath.Join(moduleRoot, "..", "shared", "traces", "mooncake_synthetic_trace.jsonl")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("shared trace not available (%v); skipping", err)
	}
	return p
}

func TestReaderValid(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []Request
	}{
		{
			name: "published format",
			in:   `{"timestamp": 0, "input_length": 1000, "output_length": 6, "hash_ids": [0, 1]}` + "\n",
			want: []Request{{Timestamp: 0, InputLength: 1000, OutputLength: 6, HashIDs: []uint64{0, 1}}},
		},
		{
			name: "exact block multiple, compact spacing, key order free",
			in:   `{"hash_ids":[7,8],"output_length":0,"input_length":1024,"timestamp":5}`,
			want: []Request{{Timestamp: 5, InputLength: 1024, HashIDs: []uint64{7, 8}}},
		},
		{
			name: "unknown fields ignored, any JSON value",
			in:   `{"timestamp": 1, "session": "a\"b\u00e9", "meta": {"x": [1, 2.5e3, null, true, false, {}]}, "input_length": 1, "output_length": 2, "hash_ids": [18446744073709551615]}`,
			want: []Request{{Timestamp: 1, InputLength: 1, OutputLength: 2, HashIDs: []uint64{18446744073709551615}}},
		},
		{
			name: "blank lines and CRLF",
			in:   "\n  \n" + `{"timestamp": 3, "input_length": 0, "output_length": 1, "hash_ids": []}` + "\r\n\r\n" + `{"timestamp": 3, "input_length": 513, "output_length": 1, "hash_ids": [1, 2]}`,
			want: []Request{
				{Timestamp: 3, InputLength: 0, OutputLength: 1, HashIDs: []uint64{}},
				{Timestamp: 3, InputLength: 513, OutputLength: 1, HashIDs: []uint64{1, 2}},
			},
		},
		{
			name: "fractional timestamps are floored to whole milliseconds",
			in: `{"timestamp": 12.5, "input_length": 1, "output_length": 0, "hash_ids": [1]}
{"timestamp": 12.9e0, "input_length": 1, "output_length": 0, "hash_ids": [1]}
{"timestamp": 1.3e1, "input_length": 1, "output_length": 0, "hash_ids": [1]}`,
			want: []Request{
				{Timestamp: 12, InputLength: 1, HashIDs: []uint64{1}},
				{Timestamp: 12, InputLength: 1, HashIDs: []uint64{1}},
				{Timestamp: 13, InputLength: 1, HashIDs: []uint64{1}},
			},
		},
		{
			name: "escaped key names a known field",
			in:   `{"\u0074imestamp": 9, "input_length": 1, "output_length": 0, "hash_ids": [4]}`,
			want: []Request{{Timestamp: 9, InputLength: 1, HashIDs: []uint64{4}}},
		},
		{name: "empty input", in: "", want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NewReader(strings.NewReader(tc.in), "t.jsonl").ReadAll()
			if err != nil {
				t.Fatalf("ReadAll: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestReaderErrors(t *testing.T) {
	const ok = `{"timestamp": 10, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}`
	tests := []struct {
		name string
		in   string
		want string // the whole error message
	}{
		{"not an object", ok + "\n[1, 2]", `t.jsonl:2:1: want a JSON object, got an array`},
		{"truncated in a key", ok + "\n" + ok[:40], `t.jsonl:2:41: unterminated string`},
		{"truncated before a value", ok + "\n" + ok[:34], `t.jsonl:2:35: input_length: want a non-negative integer, got end of line`},
		{"missing field", `{"timestamp": 10, "input_length": 600, "hash_ids": [1, 2]}`, `t.jsonl:1:1: output_length: required field is missing`},
		{"duplicate field", `{"timestamp": 10, "timestamp": 11, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}`, `t.jsonl:1:19: timestamp: field appears twice`},
		{"string length", `{"timestamp": 10, "input_length": "600", "output_length": 1, "hash_ids": [1, 2]}`, `t.jsonl:1:35: input_length: want a non-negative integer, got a string`},
		{"null length", `{"timestamp": 10, "input_length": 600, "output_length": null, "hash_ids": [1, 2]}`, `t.jsonl:1:57: output_length: want a non-negative integer, got null`},
		{"float length", `{"timestamp": 10, "input_length": 600.0, "output_length": 1, "hash_ids": [1, 2]}`, `t.jsonl:1:35: input_length: want an integer, got 600.0`},
		{"negative float timestamp", `{"timestamp": -0.5, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}`, `t.jsonl:1:15: timestamp: must not be negative, got -0.5`},
		{"huge timestamp", `{"timestamp": 1e300, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}`, `t.jsonl:1:15: timestamp: 1e300 is out of range`},
		{"timestamp malformed fraction", `{"timestamp": 1., "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}`, `t.jsonl:1:17: timestamp: malformed number (no digits after '.')`},
		{"negative length", `{"timestamp": 10, "input_length": -600, "output_length": 1, "hash_ids": [1, 2]}`, `t.jsonl:1:35: input_length: must not be negative, got -600`},
		{"length overflow", `{"timestamp": 10, "input_length": 99999999999, "output_length": 1, "hash_ids": [1, 2]}`, `t.jsonl:1:35: input_length: 99999999999 is out of range (max 2147483647)`},
		{"negative id", `{"timestamp": 10, "input_length": 600, "output_length": 1, "hash_ids": [1, -2]}`, `t.jsonl:1:76: hash_ids[1]: must not be negative, got -2`},
		{"id not a number", `{"timestamp": 10, "input_length": 600, "output_length": 1, "hash_ids": [1, "2"]}`, `t.jsonl:1:76: hash_ids[1]: want a non-negative integer, got a string`},
		{"id overflow", `{"timestamp": 10, "input_length": 600, "output_length": 1, "hash_ids": [1, 18446744073709551616]}`, `t.jsonl:1:76: hash_ids[1]: 18446744073709551616 is out of range (max 18446744073709551615)`},
		{"hash_ids not array", `{"timestamp": 10, "input_length": 600, "output_length": 1, "hash_ids": 3}`, `t.jsonl:1:72: hash_ids: want an array of non-negative integers, got a number`},
		{"too few ids", `{"timestamp": 10, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}`, `t.jsonl:1:1: hash_ids: 2 ids for input_length 1025, want ceil(1025/512) = 3 (one id per block, the last may be partial)`},
		{"too many ids", `{"timestamp": 10, "input_length": 512, "output_length": 1, "hash_ids": [1, 2]}`, `t.jsonl:1:1: hash_ids: 2 ids for input_length 512, want ceil(512/512) = 1 (one id per block, the last may be partial)`},
		{"timestamp goes back", ok + "\n\n" + strings.Replace(ok, "10", "9", 1), `t.jsonl:3: timestamp: 9 is before 10 on line 1 (the trace must be sorted by arrival time)`},
		{"trailing garbage", ok + " x", `t.jsonl:1:80: found "x" after the object (want one object per line)`},
		{"two objects on a line", ok + ok, `t.jsonl:1:79: found "{\"timestamp\"" after the object (want one object per line)`},
		{"bad unknown value", `{"timestamp": 10, "extra": tru, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}`, `t.jsonl:1:28: extra: want a JSON value, got a boolean`},
		{"missing colon", `{"timestamp" 10}`, `t.jsonl:1:14: want ':' after key "timestamp", got a number`},
		{"unquoted key", `{timestamp: 10}`, `t.jsonl:1:2: want a field name in double quotes, got "timestamp: 1"`},
		{"leading zero", `{"timestamp": 010, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}`, `t.jsonl:1:15: timestamp: malformed number (leading zero)`},
		{"control char in string", "{\"timestamp\": 10, \"x\": \"a\x01\"}", `t.jsonl:1:26: x: control character 0x01 in string`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewReader(strings.NewReader(tc.in), "t.jsonl").ReadAll()
			if err == nil {
				t.Fatalf("ReadAll succeeded, want error %q", tc.want)
			}
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("error %v does not wrap ErrMalformed", err)
			}
			if err.Error() != tc.want {
				t.Errorf("error\n got: %s\nwant: %s", err, tc.want)
			}
		})
	}
}

func TestReaderStickyError(t *testing.T) {
	r := NewReader(strings.NewReader("x\n"+`{"timestamp": 1, "input_length": 0, "output_length": 0, "hash_ids": []}`), "t")
	_, err1 := r.Next()
	_, err2 := r.Next()
	if err1 == nil || err1 != err2 {
		t.Fatalf("errors %v then %v, want the same error twice", err1, err2)
	}
}

func TestReaderIOError(t *testing.T) {
	boom := errors.New("disk on fire")
	r := NewReader(io.MultiReader(strings.NewReader(`{"timestamp": 1, "input_length": 0, "output_length": 0, "hash_ids": []}`+"\n"), errReader{boom}), "t")
	if _, err := r.Next(); err != nil {
		t.Fatalf("first line: %v", err)
	}
	_, err := r.Next()
	if !errors.Is(err, boom) || errors.Is(err, ErrMalformed) {
		t.Fatalf("got %v, want the I/O error, not ErrMalformed", err)
	}
	if !strings.Contains(err.Error(), "after line 1") {
		t.Errorf("error %q does not say where reading stopped", err)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// TestReaderMatchesEncodingJSON checks the hand-rolled decoder against
// encoding/json on the published trace, and that Write reproduces the file
// byte for byte (the trace uses the published spacing).
func TestReaderSharedTrace(t *testing.T) {
	path := sharedTrace(t)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(path)
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	if len(got) != 3993 {
		t.Errorf("read %d requests, want 3993", len(got))
	}
	var want []Request
	for i, line := range bytes.Split(bytes.TrimSpace(raw), []byte("\n")) {
		var r Request
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("line %d: encoding/json: %v", i+1, err)
		}
		want = append(want, r)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatal("hand-rolled decoder disagrees with encoding/json on the shared trace")
	}
	var out bytes.Buffer
	if err := Write(&out, got); err != nil {
		t.Fatalf("Write: %v", err)
	}
	if !bytes.Equal(out.Bytes(), raw) {
		t.Error("Write does not reproduce the shared trace byte for byte")
	}
}

func TestReadFileMissing(t *testing.T) {
	_, err := ReadFile(filepath.Join(t.TempDir(), "nope.jsonl"))
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "nope.jsonl") {
		t.Fatalf("got %v, want a not-exist error naming the file", err)
	}
}

// TestCarveIsolation checks that appending to one request's ids never
// overwrites the next request's ids (they share the reader's arena).
func TestCarveIsolation(t *testing.T) {
	in := `{"timestamp": 1, "input_length": 1, "output_length": 0, "hash_ids": [1]}
{"timestamp": 2, "input_length": 1, "output_length": 0, "hash_ids": [2]}`
	reqs, err := NewReader(strings.NewReader(in), "t").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	_ = append(reqs[0].HashIDs, 99)
	if reqs[1].HashIDs[0] != 2 {
		t.Fatalf("append to request 0 overwrote request 1: %v", reqs[1].HashIDs)
	}
}

func BenchmarkReadSharedTrace(b *testing.B) {
	raw, err := os.ReadFile(sharedTrace(b))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewReader(bytes.NewReader(raw), "t").ReadAll(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadSharedTraceEncodingJSON is the reference: encoding/json with
// a reused struct on the same bytes.
func BenchmarkReadSharedTraceEncodingJSON(b *testing.B) {
	raw, err := os.ReadFile(sharedTrace(b))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		dec := json.NewDecoder(bytes.NewReader(raw))
		n := 0
		for {
			var r Request
			if err := dec.Decode(&r); err == io.EOF {
				break
			} else if err != nil {
				b.Fatal(err)
			}
			n++
		}
		if n != 3993 {
			b.Fatalf("decoded %d requests", n)
		}
	}
}

// BenchmarkReaderVsEncodingJSON times the reader and the encoding/json
// reference alternately on the shared trace, so both see the same machine
// load, and reports the reader's speed as a multiple of the reference's
// (the figure in docs/perf.md).
func BenchmarkReaderVsEncodingJSON(b *testing.B) {
	raw, err := os.ReadFile(sharedTrace(b))
	if err != nil {
		b.Fatal(err)
	}
	var ours, ref time.Duration
	for b.Loop() {
		start := time.Now()
		reqs, err := NewReader(bytes.NewReader(raw), "t").ReadAll()
		if err != nil || len(reqs) != 3993 {
			b.Fatalf("reader: %d requests, %v", len(reqs), err)
		}
		mid := time.Now()
		dec := json.NewDecoder(bytes.NewReader(raw))
		n := 0
		for {
			var r Request
			if err := dec.Decode(&r); err == io.EOF {
				break
			} else if err != nil {
				b.Fatal(err)
			}
			n++
		}
		end := time.Now()
		if n != 3993 {
			b.Fatalf("encoding/json: %d requests", n)
		}
		ours += mid.Sub(start)
		ref += end.Sub(mid)
	}
	b.ReportMetric(float64(ours.Nanoseconds())/float64(b.N), "reader-ns/trace")
	b.ReportMetric(float64(ref.Nanoseconds())/float64(b.N), "json-ns/trace")
	b.ReportMetric(float64(len(raw))/1e6/ours.Seconds()*float64(b.N), "reader-MB/s")
	b.ReportMetric(ref.Seconds()/ours.Seconds(), "x-json")
}

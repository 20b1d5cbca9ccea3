package workload

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// ErrMalformed is wrapped by every error about the content of a trace (as
// opposed to an I/O error), so callers can tell a bad trace from a bad disk.
var ErrMalformed = errors.New("malformed trace")

// maxLineBytes bounds one trace line. A 1M-token prompt has 1954 ids, about
// 16 KiB of JSON; 64 MiB leaves room for unknown fields and still stops a
// file that is not line-oriented at all.
const maxLineBytes = 64 << 20

// LineError is a problem on one line of a trace. Its message reads
// "FILE:LINE:COLUMN: FIELD: what is wrong" (column and field when known).
type LineError struct {
	// File is the trace's name as given to NewReader.
	File string
	// Line is the 1-based line number.
	Line int
	// Column is the 1-based byte column of the problem, 0 if not known.
	Column int
	// Field names the field, e.g. "input_length" or "hash_ids[3]"; empty
	// for a syntax error outside any known field.
	Field string
	// Msg says what is wrong.
	Msg string
}

// Error implements error.
func (e *LineError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s:%d", e.File, e.Line)
	if e.Column > 0 {
		fmt.Fprintf(&b, ":%d", e.Column)
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns ErrMalformed.
func (e *LineError) Unwrap() error { return ErrMalformed }

// Reader reads a Mooncake FAST'25 JSONL trace, one request per line:
//
//	{"timestamp": 0, "input_length": 40160, "output_length": 6, "hash_ids": [0, 1, ...]}
//
// It is strict about what replay relies on and lenient about the rest:
//   - timestamp, input_length, output_length and hash_ids are required and
//     may appear only once; lengths and ids are non-negative JSON integers
//     (ids: an array of them, up to 2^64-1); the timestamp is a
//     non-negative number of milliseconds, floored to a whole millisecond
//     when it has a fraction (traces written by other tools carry 12.5);
//   - hash_ids has exactly ceil(input_length/512) ids, one per block with the
//     last block possibly partial — every line of the published synthetic
//     trace obeys this, and a mismatch means the hit-token accounting of
//     replay would be wrong;
//   - timestamps never decrease from one line to the next: replay takes the
//     file order as arrival order, so an unsorted (e.g. concatenated) trace
//     is refused rather than silently replayed in the wrong order;
//   - unknown fields are accepted and ignored (real traces carry extra keys
//     such as session ids), but must be valid JSON;
//   - blank (whitespace-only) lines are skipped; line numbers still count
//     them. A "\r\n" line ending is accepted.
//
// Every content error is a *LineError wrapping ErrMalformed.
type Reader struct {
	sc       *bufio.Scanner
	name     string
	line     int
	prevTS   int64
	prevLine int
	p        lineParser
	arena    []uint64
	err      error
}

// NewReader returns a Reader of the trace r; name (usually the file path)
// prefixes every error.
func NewReader(r io.Reader, name string) *Reader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 256<<10), maxLineBytes)
	return &Reader{sc: sc, name: name}
}

// Line returns the number of the line read last (1-based), 0 before the
// first.
func (r *Reader) Line() int { return r.line }

// Next returns the next request, or io.EOF after the last. After an error
// other than io.EOF every later call returns the same error. The returned
// HashIDs are the caller's (the Reader never writes them again).
func (r *Reader) Next() (Request, error) {
	if r.err != nil {
		return Request{}, r.err
	}
	for r.sc.Scan() {
		r.line++
		b := r.sc.Bytes()
		if isBlank(b) {
			continue
		}
		r.p.b = b
		var req Request
		if ferr := r.p.parse(&req); ferr != nil {
			r.err = &LineError{File: r.name, Line: r.line, Column: ferr.off + 1, Field: ferr.field, Msg: ferr.msg}
			return Request{}, r.err
		}
		if r.prevLine > 0 && req.Timestamp < r.prevTS {
			r.err = &LineError{File: r.name, Line: r.line, Field: "timestamp",
				Msg: fmt.Sprintf("%d is before %d on line %d (the trace must be sorted by arrival time)", req.Timestamp, r.prevTS, r.prevLine)}
			return Request{}, r.err
		}
		r.prevTS, r.prevLine = req.Timestamp, r.line
		req.HashIDs = r.carve(r.p.ids)
		return req, nil
	}
	if err := r.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			r.err = &LineError{File: r.name, Line: r.line + 1, Msg: fmt.Sprintf("line longer than %d bytes", maxLineBytes)}
		} else {
			r.err = fmt.Errorf("read trace %s after line %d: %w", r.name, r.line, err)
		}
		return Request{}, r.err
	}
	r.err = io.EOF
	return Request{}, io.EOF
}

// carve copies ids into the reader's arena and returns a slice of exactly
// their length and capacity, so an append by the caller never writes into
// another request's ids. Allocating ids in chunks keeps a whole-trace read
// at a handful of allocations per thousand lines.
func (r *Reader) carve(ids []uint64) []uint64 {
	if len(ids) == 0 {
		return []uint64{}
	}
	if len(ids) > len(r.arena) {
		n := 64 << 10
		if len(ids) > n {
			n = len(ids)
		}
		r.arena = make([]uint64, n)
	}
	out := r.arena[:len(ids):len(ids)]
	copy(out, ids)
	r.arena = r.arena[len(ids):]
	return out
}

// ReadAll reads the remaining requests. It returns the requests read so far
// together with the first error (never io.EOF).
func (r *Reader) ReadAll() ([]Request, error) {
	var out []Request
	for {
		req, err := r.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, req)
	}
}

// ReadFile reads the whole trace at path.
func ReadFile(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	reqs, err := NewReader(f, path).ReadAll()
	if err != nil {
		return nil, err
	}
	return reqs, nil
}

func isBlank(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\r' {
			return false
		}
	}
	return true
}

package workload

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// This file is the hand-rolled decoder of one trace line. It exists because
// traces are large (every line a few hundred integers) and because a person
// fixing a broken trace needs the field and column of the first problem,
// which encoding/json does not give for missing or duplicated fields.
//
// Rules (documented on Reader): one JSON object per line; the four known
// fields are required, typed and appear once; unknown fields are accepted
// and skipped, but must still be valid JSON.

// maxSkipDepth bounds the nesting of skipped unknown values, so a hostile
// line cannot make the decoder recurse without limit.
const maxSkipDepth = 512

// fieldError is a problem at a byte offset of the line, inside field (empty
// for a syntax problem outside any known field).
type fieldError struct {
	off   int
	field string
	msg   string
}

func (e *fieldError) Error() string { return e.msg }

// Known fields, as bits of the "seen" mask.
const (
	seenTimestamp = 1 << iota
	seenInput
	seenOutput
	seenHashIDs
	seenAll = seenTimestamp | seenInput | seenOutput | seenHashIDs
)

// lineParser decodes one line into a Request; ids is scratch space for the
// hash ids, reused across lines.
type lineParser struct {
	b   []byte
	i   int
	ids []uint64
}

func (p *lineParser) errf(field, format string, args ...any) *fieldError {
	return &fieldError{off: p.i, field: field, msg: fmt.Sprintf(format, args...)}
}

func (p *lineParser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\r', '\n':
			p.i++
		default:
			return
		}
	}
}

// parse decodes p.b into req (HashIDs left in p.ids).
func (p *lineParser) parse(req *Request) *fieldError {
	p.i = 0
	p.ids = p.ids[:0]
	*req = Request{}
	p.ws()
	if p.i >= len(p.b) || p.b[p.i] != '{' {
		return p.errf("", "want a JSON object, got %s", p.describe())
	}
	p.i++
	seen := 0
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
	} else {
		for {
			p.ws()
			keyOff := p.i
			rawKey, ferr := p.key()
			if ferr != nil {
				return ferr
			}
			key := fieldName(rawKey)
			p.ws()
			if p.i >= len(p.b) || p.b[p.i] != ':' {
				return p.errf("", "want ':' after key %q, got %s", key, p.describe())
			}
			p.i++
			p.ws()
			bit := 0
			switch key {
			case "timestamp":
				bit = seenTimestamp
			case "input_length":
				bit = seenInput
			case "output_length":
				bit = seenOutput
			case "hash_ids":
				bit = seenHashIDs
			}
			if bit != 0 && seen&bit != 0 {
				p.i = keyOff
				return p.errf(key, "field appears twice")
			}
			seen |= bit
			switch bit {
			case seenTimestamp:
				v, ferr := p.timestamp()
				if ferr != nil {
					return ferr
				}
				req.Timestamp = v
			case seenInput:
				v, ferr := p.int(key, math.MaxInt32)
				if ferr != nil {
					return ferr
				}
				req.InputLength = int(v)
			case seenOutput:
				v, ferr := p.int(key, math.MaxInt32)
				if ferr != nil {
					return ferr
				}
				req.OutputLength = int(v)
			case seenHashIDs:
				if ferr := p.hashIDs(); ferr != nil {
					return ferr
				}
			default:
				if ferr := p.skip(key, 0); ferr != nil {
					return ferr
				}
			}
			p.ws()
			if p.i < len(p.b) && p.b[p.i] == ',' {
				p.i++
				continue
			}
			if p.i < len(p.b) && p.b[p.i] == '}' {
				p.i++
				break
			}
			return p.errf("", "want ',' or '}' after field %q, got %s", key, p.describe())
		}
	}
	p.ws()
	if p.i != len(p.b) {
		return p.errf("", "found %s after the object (want one object per line)", p.snippet())
	}
	if seen != seenAll {
		for _, f := range []struct {
			bit  int
			name string
		}{{seenTimestamp, "timestamp"}, {seenInput, "input_length"}, {seenOutput, "output_length"}, {seenHashIDs, "hash_ids"}} {
			if seen&f.bit == 0 {
				p.i = 0
				return p.errf(f.name, "required field is missing")
			}
		}
	}
	if want := Blocks(req.InputLength); len(p.ids) != want {
		p.i = 0
		return p.errf("hash_ids", "%d ids for input_length %d, want ceil(%d/%d) = %d (one id per block, the last may be partial)",
			len(p.ids), req.InputLength, req.InputLength, BlockTokens, want)
	}
	return nil
}

// fieldName returns the key as a string, without allocating for the four
// known fields (the common case on every line).
func fieldName(k []byte) string {
	switch string(k) {
	case "timestamp":
		return "timestamp"
	case "input_length":
		return "input_length"
	case "output_length":
		return "output_length"
	case "hash_ids":
		return "hash_ids"
	}
	return string(k)
}

// describe names what is at p.i, for "want X, got Y" messages.
func (p *lineParser) describe() string {
	if p.i >= len(p.b) {
		return "end of line"
	}
	switch c := p.b[p.i]; {
	case c == '"':
		return "a string"
	case c == '{':
		return "an object"
	case c == '[':
		return "an array"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == 'n':
		return "null"
	case c == '-' || (c >= '0' && c <= '9'):
		return "a number"
	default:
		return fmt.Sprintf("%q", rune(c))
	}
}

// snippet quotes the next few bytes at p.i, for messages about text that
// is not a JSON value at all.
func (p *lineParser) snippet() string {
	if p.i >= len(p.b) {
		return "end of line"
	}
	end := min(p.i+12, len(p.b))
	return fmt.Sprintf("%q", p.b[p.i:end])
}

// key reads an object key. Keys without escapes are returned as a slice of
// the line (no allocation); escaped keys (rare) go through encoding/json.
func (p *lineParser) key() ([]byte, *fieldError) {
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return nil, p.errf("", "want a field name in double quotes, got %s", p.snippet())
	}
	start := p.i
	escaped, ferr := p.str("")
	if ferr != nil {
		return nil, ferr
	}
	raw := p.b[start:p.i]
	if !escaped {
		return raw[1 : len(raw)-1], nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		p.i = start
		return nil, p.errf("", "bad field name: %v", err)
	}
	return []byte(s), nil
}

// str skips a JSON string starting at p.i and reports whether it had
// escapes.
func (p *lineParser) str(field string) (bool, *fieldError) {
	p.i++ // opening quote
	escaped := false
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return escaped, nil
		case c == '\\':
			escaped = true
			p.i++
			if p.i >= len(p.b) {
				return false, p.errf(field, "unterminated string")
			}
			switch p.b[p.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				p.i++
			case 'u':
				p.i++
				for k := 0; k < 4; k++ {
					if p.i >= len(p.b) || !isHex(p.b[p.i]) {
						return false, p.errf(field, "bad \\u escape in string")
					}
					p.i++
				}
			default:
				return false, p.errf(field, "bad escape \\%c in string", p.b[p.i])
			}
		case c < 0x20:
			return false, p.errf(field, "control character %#02x in string", c)
		default:
			p.i++
		}
	}
	return false, p.errf(field, "unterminated string")
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// int reads a non-negative JSON integer no larger than max.
func (p *lineParser) int(field string, max uint64) (uint64, *fieldError) {
	if p.i >= len(p.b) {
		return 0, p.errf(field, "want a non-negative integer, got end of line")
	}
	c := p.b[p.i]
	if c != '-' && (c < '0' || c > '9') {
		return 0, p.errf(field, "want a non-negative integer, got %s", p.describe())
	}
	start := p.i
	neg := c == '-'
	if neg {
		p.i++
	}
	if p.i >= len(p.b) || p.b[p.i] < '0' || p.b[p.i] > '9' {
		p.i = start
		return 0, p.errf(field, "malformed number")
	}
	var v uint64
	overflow := false
	leadingZero := p.b[p.i] == '0'
	digits := 0
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		d := uint64(p.b[p.i] - '0')
		if v > (math.MaxUint64-d)/10 {
			overflow = true
		} else {
			v = v*10 + d
		}
		p.i++
		digits++
	}
	if leadingZero && digits > 1 {
		p.i = start
		return 0, p.errf(field, "malformed number (leading zero)")
	}
	if p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		if ferr := p.numberTail(field); ferr != nil {
			return 0, ferr
		}
		text := string(p.b[start:p.i])
		p.i = start
		return 0, p.errf(field, "want an integer, got %s", text)
	}
	if neg && v != 0 {
		p.i = start
		return 0, p.errf(field, "must not be negative, got %s", p.b[start:start+digits+1])
	}
	if overflow || v > max {
		p.i = start
		return 0, p.errf(field, "%s is out of range (max %d)", p.b[start:start+digits], max)
	}
	return v, nil
}

// timestamp reads the timestamp: a non-negative JSON number of
// milliseconds. Integers are exact; a fraction or exponent (traces written
// by other tools carry "timestamp": 12.5) is floored to whole milliseconds,
// which keeps the order of a sorted trace.
func (p *lineParser) timestamp() (int64, *fieldError) {
	start := p.i
	v, ferr := p.int("timestamp", math.MaxInt64)
	if ferr == nil {
		return int64(v), nil
	}
	// Retry as a decimal only where int refused a fraction or exponent.
	p.i = start
	neg := p.i < len(p.b) && p.b[p.i] == '-'
	if neg {
		p.i++
	}
	digits := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	if p.i == digits || p.i >= len(p.b) || (p.b[p.i] != '.' && p.b[p.i] != 'e' && p.b[p.i] != 'E') ||
		(p.i-digits > 1 && p.b[digits] == '0') {
		p.i = start
		return 0, ferr
	}
	if tail := p.numberTail("timestamp"); tail != nil {
		return 0, tail
	}
	text := string(p.b[start:p.i])
	f, err := strconv.ParseFloat(text, 64)
	switch {
	case neg && f != 0:
		p.i = start
		return 0, p.errf("timestamp", "must not be negative, got %s", text)
	case err != nil || f >= math.MaxInt64:
		p.i = start
		return 0, p.errf("timestamp", "%s is out of range", text)
	}
	return int64(math.Floor(f)), nil
}

// numberTail skips the fraction and exponent of a number, checking their
// syntax.
func (p *lineParser) numberTail(field string) *fieldError {
	if p.i < len(p.b) && p.b[p.i] == '.' {
		p.i++
		n := 0
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
			n++
		}
		if n == 0 {
			return p.errf(field, "malformed number (no digits after '.')")
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		n := 0
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
			n++
		}
		if n == 0 {
			return p.errf(field, "malformed number (no digits in exponent)")
		}
	}
	return nil
}

// hashIDs reads the hash_ids array into p.ids.
func (p *lineParser) hashIDs() *fieldError {
	if p.i >= len(p.b) || p.b[p.i] != '[' {
		return p.errf("hash_ids", "want an array of non-negative integers, got %s", p.describe())
	}
	p.i++
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == ']' {
		p.i++
		return nil
	}
	for {
		p.ws()
		// Fast path: plain decimal digits, the whole of every real trace.
		start := p.i
		var v uint64
		n := 0
		for p.i < len(p.b) && n < 19 {
			c := p.b[p.i]
			if c < '0' || c > '9' {
				break
			}
			v = v*10 + uint64(c-'0')
			p.i++
			n++
		}
		if n == 0 || n == 19 || (n > 1 && p.b[start] == '0') ||
			(p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E')) {
			// Slow path: let int() produce the exact value or message.
			p.i = start
			var ferr *fieldError
			v, ferr = p.int(fmt.Sprintf("hash_ids[%d]", len(p.ids)), math.MaxUint64)
			if ferr != nil {
				return ferr
			}
		}
		p.ids = append(p.ids, v)
		p.ws()
		if p.i < len(p.b) && p.b[p.i] == ',' {
			p.i++
			continue
		}
		if p.i < len(p.b) && p.b[p.i] == ']' {
			p.i++
			return nil
		}
		return p.errf(fmt.Sprintf("hash_ids[%d]", len(p.ids)-1), "want ',' or ']' after an id, got %s", p.describe())
	}
}

// skip skips any JSON value (the value of an unknown field).
func (p *lineParser) skip(field string, depth int) *fieldError {
	if depth > maxSkipDepth {
		return p.errf(field, "value nested deeper than %d levels", maxSkipDepth)
	}
	if p.i >= len(p.b) {
		return p.errf(field, "want a value, got end of line")
	}
	switch c := p.b[p.i]; {
	case c == '"':
		_, ferr := p.str(field)
		return ferr
	case c == '{':
		p.i++
		p.ws()
		if p.i < len(p.b) && p.b[p.i] == '}' {
			p.i++
			return nil
		}
		for {
			p.ws()
			if _, ferr := p.key(); ferr != nil {
				ferr.field = field
				return ferr
			}
			p.ws()
			if p.i >= len(p.b) || p.b[p.i] != ':' {
				return p.errf(field, "want ':' in object, got %s", p.describe())
			}
			p.i++
			p.ws()
			if ferr := p.skip(field, depth+1); ferr != nil {
				return ferr
			}
			p.ws()
			if p.i < len(p.b) && p.b[p.i] == ',' {
				p.i++
				continue
			}
			if p.i < len(p.b) && p.b[p.i] == '}' {
				p.i++
				return nil
			}
			return p.errf(field, "want ',' or '}' in object, got %s", p.describe())
		}
	case c == '[':
		p.i++
		p.ws()
		if p.i < len(p.b) && p.b[p.i] == ']' {
			p.i++
			return nil
		}
		for {
			p.ws()
			if ferr := p.skip(field, depth+1); ferr != nil {
				return ferr
			}
			p.ws()
			if p.i < len(p.b) && p.b[p.i] == ',' {
				p.i++
				continue
			}
			if p.i < len(p.b) && p.b[p.i] == ']' {
				p.i++
				return nil
			}
			return p.errf(field, "want ',' or ']' in array, got %s", p.describe())
		}
	case c == '-' || (c >= '0' && c <= '9'):
		start := p.i
		if c == '-' {
			p.i++
		}
		n := 0
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
			n++
		}
		if n == 0 || (n > 1 && p.b[p.i-n] == '0') {
			p.i = start
			return p.errf(field, "malformed number")
		}
		return p.numberTail(field)
	default:
		for _, lit := range []string{"true", "false", "null"} {
			if len(p.b)-p.i >= len(lit) && string(p.b[p.i:p.i+len(lit)]) == lit {
				p.i += len(lit)
				return nil
			}
		}
		return p.errf(field, "want a JSON value, got %s", p.describe())
	}
}

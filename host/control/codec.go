package control

import (
	"crypto/sha256"
	"fmt"
	"strconv"
	"strings"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
)

// Bounds of the text encoding: a line longer than MaxEventBytes or naming
// more than MaxEventPages pages is refused before it is split, so decoding
// costs O(len(line)).
const (
	// MaxEventBytes is the longest event line.
	MaxEventBytes = 1 << 20
	// MaxEventPages is the most pages one event may name.
	MaxEventPages = 1 << 14
	// maxNameBytes is the longest page name.
	maxNameBytes = 64
)

// PageHash returns the page hash a scenario or a fuzzer calls name:
// SHA-256 of "kvtier.control.page/" and the name. Real keys are
// pagehash chains; names make scenario files readable.
func PageHash(name string) pagehash.Hash {
	return pagehash.Hash(sha256.Sum256([]byte("kvtier.control.page/" + name)))
}

// ParseEvent decodes one event of the text encoding that scenario files,
// tests and the fuzzer share: a kind and key=value fields separated by
// spaces, each key at most once.
//
//	match req=1 [pages=3] hashes=a,b,c
//	insert req=1 [pages=3] hashes=a,b,c
//	extend req=1 node=4 [pages=2] hashes=d,e
//	finish req=1
//	release req=1
//	flush
//	done op=3 stage=gathered ok|fail
//	longest op=5 pages=2
//	tier tier=3 up|down
//	upcoming [[pages=3] hashes=a,b,c]
//
// Page names are 1 to 64 of [A-Za-z0-9_.-], hashed by PageHash; pages,
// when given, is checked by Apply against the number of names (a
// mismatch breaks the contract), and is the number of names otherwise.
func ParseEvent(line string) (Event, error) {
	if len(line) > MaxEventBytes {
		return Event{}, fmt.Errorf("event: line of %d bytes, at most %d", len(line), MaxEventBytes)
	}
	if strings.Count(line, ",") >= MaxEventPages {
		return Event{}, fmt.Errorf("event: more than %d pages", MaxEventPages)
	}
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return Event{}, fmt.Errorf("event: empty line")
	}
	var e Event
	for k, n := range eventNames {
		if k > 0 && n == fields[0] {
			e.Kind = EventKind(k)
		}
	}
	if e.Kind == 0 {
		return Event{}, fmt.Errorf("event %q: unknown kind (want one of %s)", fields[0], strings.Join(eventNames[1:], ", "))
	}
	seen := map[string]bool{}
	var flag string
	for _, f := range fields[1:] {
		key, val, hasVal := strings.Cut(f, "=")
		if seen[key] {
			return Event{}, fmt.Errorf("event %s: %s given twice", e.Kind, key)
		}
		seen[key] = true
		if !hasVal {
			if flag != "" {
				return Event{}, fmt.Errorf("event %s: two flags %q and %q", e.Kind, flag, key)
			}
			flag = key
			continue
		}
		if err := e.setField(key, val); err != nil {
			return Event{}, fmt.Errorf("event %s: %w", e.Kind, err)
		}
	}
	return e, e.finish(seen, flag)
}

func (e *Event) setField(key, val string) error {
	num := func() (uint64, error) {
		v, err := strconv.ParseUint(val, 10, 63)
		if err != nil {
			return 0, fmt.Errorf("%s=%q: want a non-negative integer", key, val)
		}
		return v, nil
	}
	var err error
	var v uint64
	switch key {
	case "req":
		v, err = num()
		e.Req = ReqID(v)
	case "node":
		v, err = num()
		e.Node = policy.NodeID(v)
	case "op":
		v, err = num()
		e.Op = OpID(v)
	case "pages":
		v, err = num()
		if err == nil && v > MaxEventPages {
			err = fmt.Errorf("pages=%d: at most %d", v, MaxEventPages)
		}
		e.Pages = int(v)
	case "tier":
		v, err = num()
		if err == nil && v > 8 {
			err = fmt.Errorf("tier=%d: at most 8", v)
		}
		e.Tier = int(v)
	case "stage":
		e.Stage, err = ParseStage(val)
	case "hashes":
		e.Hashes, err = parseNames(val)
	default:
		err = fmt.Errorf("unknown field %q", key)
	}
	return err
}

func parseNames(val string) ([]pagehash.Hash, error) {
	if val == "" {
		return nil, nil
	}
	names := strings.Split(val, ",")
	hs := make([]pagehash.Hash, len(names))
	for i, n := range names {
		if len(n) == 0 || len(n) > maxNameBytes {
			return nil, fmt.Errorf("hashes: page %d name %q: want 1 to %d characters", i, n, maxNameBytes)
		}
		for _, c := range []byte(n) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
				return nil, fmt.Errorf("hashes: page %d name %q: character %q not in [A-Za-z0-9_.-]", i, n, c)
			}
		}
		hs[i] = PageHash(n)
	}
	return hs, nil
}

// finish checks the fields a kind needs and allows.
func (e *Event) finish(seen map[string]bool, flag string) error {
	var need, allow []string
	var flags []string
	switch e.Kind {
	case EvMatch, EvInsert:
		need, allow = []string{"req", "hashes"}, []string{"pages"}
	case EvExtend:
		need, allow = []string{"req", "node", "hashes"}, []string{"pages"}
	case EvFinish, EvRelease:
		need = []string{"req"}
	case EvFlush:
	case EvDone:
		need, flags = []string{"op", "stage"}, []string{"ok", "fail"}
	case EvLongest:
		need = []string{"op", "pages"}
	case EvTier:
		need, flags = []string{"tier"}, []string{"up", "down"}
	case EvUpcoming:
		allow = []string{"pages", "hashes"}
	}
	for _, k := range need {
		if !seen[k] {
			return fmt.Errorf("event %s: missing %s", e.Kind, k)
		}
	}
	for k := range seen {
		if k == flag {
			continue
		}
		ok := false
		for _, a := range append(need, allow...) {
			ok = ok || a == k
		}
		if !ok {
			return fmt.Errorf("event %s: field %s not allowed", e.Kind, k)
		}
	}
	if flags == nil {
		if flag != "" {
			return fmt.Errorf("event %s: unexpected flag %q", e.Kind, flag)
		}
	} else {
		switch flag {
		case flags[0]:
			e.OK = true
		case flags[1]:
		default:
			return fmt.Errorf("event %s: want flag %s or %s, got %q", e.Kind, flags[0], flags[1], flag)
		}
	}
	if !seen["pages"] && (e.Kind == EvMatch || e.Kind == EvInsert || e.Kind == EvExtend || e.Kind == EvUpcoming) {
		e.Pages = len(e.Hashes)
	}
	return nil
}

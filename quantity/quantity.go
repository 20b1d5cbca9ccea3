// Package quantity is the one syntax of sizes (bytes) and token counts in
// kvtier's YAML configs and command-line flags: Size and Tokens, their
// parsers and their printed form. Every module's config uses it, so one
// YAML file reads by one rule everywhere; and it carries Quote and Clip,
// the one way text taken from a config enters an error message.
//
// It is a leaf: it must never import another kvtier package (a tier, an
// index or the host's config loader may all import it), and it keeps no
// state.
package quantity

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/token"
)

// ErrBadQuantity is matched (errors.Is) by every ParseSize, ParseTokens
// and ParseTokenList error, and by the YAML decoding errors of Size and
// Tokens.
var ErrBadQuantity = errors.New("bad quantity")

// quantityError is a parse error that matches ErrBadQuantity without
// repeating its text at the end of every message.
type quantityError struct{ msg string }

func (e *quantityError) Error() string        { return e.msg }
func (e *quantityError) Is(target error) bool { return target == ErrBadQuantity }

func quantityErr(format string, args ...any) error {
	return &quantityError{msg: fmt.Sprintf(format, args...)}
}

// maxQuantityText bounds the text ParseSize and ParseTokens look at: the
// longest valid quantity ("9223372036854775806", a fraction of a few
// digits and a unit) is far shorter, and big.Int arithmetic on a longer
// run of digits would cost time for nothing.
const maxQuantityText = 64

// Size is a number of bytes. In YAML it is either a plain integer of bytes
// (4096) or a string with a unit: binary KiB, MiB, GiB, TiB (powers of
// 1024), decimal KB, MB, GB, TB (powers of 1000) or B, with an optional
// fraction that must come to a whole number of bytes ("2.75MiB" is
// 2883584 bytes, "0.1KiB" is refused). Units are case-insensitive; a bare
// "K", "M" or "G" is refused as ambiguous, and so is an exponent ("1e3").
// A Size is never negative.
//
// Its YAML decoding errors carry the position of the value, so a config
// loader reports them with the YAML path and line.
type Size int64

// Byte multiples.
const (
	KiB Size = 1 << 10
	MiB Size = 1 << 20
	GiB Size = 1 << 30
	TiB Size = 1 << 40
)

var sizeUnits = []struct {
	name string
	mult int64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1},
}

// ParseSize parses a size such as "64GiB", "2.75MiB", "1.5GB" or "4096".
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	if len(t) > maxQuantityText {
		return 0, quantityErr("size %s: too long for a size", Quote(s))
	}
	if strings.HasPrefix(t, "-") {
		return 0, quantityErr("size %s: must not be negative", Quote(s))
	}
	num, unit := splitNumber(t)
	if num == "" {
		return 0, quantityErr("size %s: want a number of bytes or a number with a unit (KiB, MiB, GiB, TiB, KB, MB, GB, TB, B)", Quote(s))
	}
	unit = strings.TrimSpace(unit)
	mult := int64(1)
	if unit != "" {
		found := false
		for _, u := range sizeUnits {
			if strings.EqualFold(unit, u.name) {
				mult, found = u.mult, true
				break
			}
		}
		if !found && len(unit) > 1 && (unit[0] == 'e' || unit[0] == 'E') && unit[1] >= '0' && unit[1] <= '9' {
			return 0, quantityErr("size %s: exponent notation is not accepted; write the bytes out or use a unit (KiB, MiB, GiB, TiB, KB, MB, GB, TB)", Quote(s))
		}
		if !found {
			return 0, quantityErr("size %s: unknown unit %s (want KiB, MiB, GiB, TiB for powers of 1024, KB, MB, GB, TB for powers of 1000, or B)", Quote(s), Quote(unit))
		}
	}
	v, err := scaleDecimal(num, mult)
	if err != nil {
		return 0, quantityErr("size %s: %v", Quote(s), err)
	}
	return Size(v), nil
}

// String returns the size in the largest unit, binary or decimal, that
// expresses it exactly as a whole number or, below 10000 units, with at
// most two decimals ("2.75MiB", "64GiB", "1.5GB"); else in bytes.
// ParseSize(s.String()) == s for every s >= 0. It is the one printed form
// of a size, in configs and in messages alike.
func (s Size) String() string {
	for _, u := range displayUnits {
		if int64(s) < u.mult {
			continue
		}
		// Exact with two decimals: s*100 divisible by mult.
		r := new(big.Int).Mul(big.NewInt(int64(s)), big.NewInt(100))
		if new(big.Int).Rem(r, big.NewInt(u.mult)).Sign() != 0 {
			continue
		}
		centi := new(big.Int).Quo(r, big.NewInt(u.mult)).Int64()
		whole, frac := centi/100, centi%100
		if frac == 0 {
			return strconv.FormatInt(whole, 10) + u.name
		}
		if whole < 10000 {
			return strconv.FormatInt(whole, 10) + strings.TrimRight(fmt.Sprintf(".%02d", frac), "0") + u.name
		}
	}
	return strconv.FormatInt(int64(s), 10)
}

// displayUnits orders the units for String, largest first.
var displayUnits = []struct {
	name string
	mult int64
}{
	{"TiB", 1 << 40}, {"TB", 1e12}, {"GiB", 1 << 30}, {"GB", 1e9},
	{"MiB", 1 << 20}, {"MB", 1e6}, {"KiB", 1 << 10}, {"KB", 1e3},
}

// UnmarshalYAML decodes an integer or a unit string.
func (s *Size) UnmarshalYAML(node ast.Node) error {
	var text string
	switch n := node.(type) {
	case *ast.IntegerNode:
		text = n.GetToken().Value
	case *ast.StringNode:
		text = n.Value
	default:
		return nodeErr(node, nil, "want a size such as 4096, 2MiB or 2.75MiB, got %s", Describe(node))
	}
	v, err := ParseSize(text)
	if err != nil {
		return nodeErr(node, err, "%v", err)
	}
	*s = v
	return nil
}

// MarshalYAML writes the size as String does.
func (s Size) MarshalYAML() (any, error) {
	if str := s.String(); strings.ContainsAny(str, "KMGTiB") {
		return str, nil
	}
	return int64(s), nil
}

// Tokens is a number of tokens, used for cache capacities. Written as a
// plain integer, with a decimal suffix K, M or G (thousands, millions,
// billions: "3M" is 3,000,000, "1.5M" is 1,500,000), or "inf" for no limit.
type Tokens int64

// InfiniteTokens is the value of "inf": larger than any real capacity, so
// comparisons and divisions need no special case.
const InfiniteTokens Tokens = math.MaxInt64

// IsInf reports whether t is InfiniteTokens.
func (t Tokens) IsInf() bool { return t == InfiniteTokens }

var tokenUnits = []struct {
	name string
	mult int64
}{{"K", 1e3}, {"M", 1e6}, {"G", 1e9}}

// ParseTokens parses "1M", "3M", "10K", "1.5M", "4096" or "inf".
func ParseTokens(s string) (Tokens, error) {
	t := strings.TrimSpace(s)
	if len(t) > maxQuantityText {
		return 0, quantityErr("token count %s: too long for a token count", Quote(s))
	}
	if strings.HasPrefix(t, "-") {
		return 0, quantityErr("token count %s: must not be negative", Quote(s))
	}
	if strings.EqualFold(t, "inf") || strings.EqualFold(t, "infinite") {
		return InfiniteTokens, nil
	}
	num, unit := splitNumber(t)
	if num == "" {
		return 0, quantityErr("token count %s: want a number such as 4096, 1M or 1.5M, or inf", Quote(s))
	}
	mult := int64(1)
	if unit != "" {
		found := false
		for _, u := range tokenUnits {
			if strings.EqualFold(strings.TrimSpace(unit), u.name) {
				mult, found = u.mult, true
				break
			}
		}
		if !found {
			return 0, quantityErr("token count %s: unknown suffix %s (want K, M or G, or inf)", Quote(s), Quote(unit))
		}
	}
	v, err := scaleDecimal(num, mult)
	if err != nil {
		return 0, quantityErr("token count %s: %v", Quote(s), err)
	}
	if v == math.MaxInt64 {
		return 0, quantityErr("token count %s: too large (write inf for no limit)", Quote(s))
	}
	return Tokens(v), nil
}

// maxTokenListItems bounds ParseTokenList: a capacity sweep of more points
// than this is a mistake, and the bound keeps a hostile flag cheap.
const maxTokenListItems = 1024

// ParseTokenList parses a comma-separated list such as "1M,3M,10M,inf", the
// form of `kvtier replay --capacity`. Empty items are refused, and so is a
// list of more than 1024 items.
func ParseTokenList(s string) ([]Tokens, error) {
	if n := strings.Count(s, ",") + 1; n > maxTokenListItems {
		return nil, quantityErr("token count list of %d items, at most %d", n, maxTokenListItems)
	}
	parts := strings.Split(s, ",")
	out := make([]Tokens, 0, len(parts))
	for i, p := range parts {
		t, err := ParseTokens(p)
		if err != nil {
			return nil, quantityErr("item %d of %s: %v", i+1, Quote(s), err)
		}
		out = append(out, t)
	}
	return out, nil
}

// String returns "inf", or the shortest exact form with a K, M or G suffix
// ("3M", "1.5M", "4096"). ParseTokens(t.String()) == t.
func (t Tokens) String() string {
	if t.IsInf() {
		return "inf"
	}
	for i := len(tokenUnits) - 1; i >= 0; i-- {
		u := tokenUnits[i]
		if int64(t) >= u.mult && (int64(t)*1000)%u.mult == 0 && int64(t) < math.MaxInt64/1000 {
			milli := int64(t) * 1000 / u.mult
			str := strconv.FormatInt(milli/1000, 10)
			if frac := milli % 1000; frac != 0 {
				str += strings.TrimRight(fmt.Sprintf(".%03d", frac), "0")
			}
			return str + u.name
		}
	}
	return strconv.FormatInt(int64(t), 10)
}

// Human returns "inf", or the count for a person to read in a table or a
// plot label: below 1000 the integer, else the largest of K, M or G with
// at most two decimals, trailing zeros trimmed ("3M", "121.97M", "6.5K").
// Unlike String it rounds, so it is not for reading back: print String
// (or the integer) where a value must round-trip.
func (t Tokens) Human() string {
	if t.IsInf() {
		return "inf"
	}
	if t < 1000 {
		return strconv.FormatInt(int64(t), 10)
	}
	i := len(tokenUnits) - 1
	for i > 0 && int64(t) < tokenUnits[i].mult {
		i--
	}
	str := strconv.FormatFloat(float64(t)/float64(tokenUnits[i].mult), 'f', 2, 64)
	// NB: 999,996 rounds to "1000.00K": print it as the next unit's 1M.
	if strings.HasPrefix(str, "1000.") && i+1 < len(tokenUnits) {
		i++
		str = strconv.FormatFloat(float64(t)/float64(tokenUnits[i].mult), 'f', 2, 64)
	}
	str = strings.TrimRight(strings.TrimRight(str, "0"), ".")
	return str + tokenUnits[i].name
}

// UnmarshalYAML decodes an integer, a suffixed string or "inf".
func (t *Tokens) UnmarshalYAML(node ast.Node) error {
	var text string
	switch n := node.(type) {
	case *ast.IntegerNode:
		text = n.GetToken().Value
	case *ast.StringNode:
		text = n.Value
	case *ast.InfinityNode:
		text = "inf"
	default:
		return nodeErr(node, nil, "want a token count such as 4096, 1M or inf, got %s", Describe(node))
	}
	v, err := ParseTokens(text)
	if err != nil {
		return nodeErr(node, err, "%v", err)
	}
	*t = v
	return nil
}

// MarshalYAML writes the count as String does.
func (t Tokens) MarshalYAML() (any, error) {
	str := t.String()
	if _, err := strconv.ParseInt(str, 10, 64); err == nil {
		return int64(t), nil
	}
	return str, nil
}

// splitNumber splits "2.75MiB" into "2.75" and "MiB". The number part is
// digits with at most one '.', not starting with a sign; it is empty when
// the text does not start with a digit.
func splitNumber(s string) (num, unit string) {
	i, dots := 0, 0
	for i < len(s) && ((s[i] >= '0' && s[i] <= '9') || (s[i] == '.' && dots == 0)) {
		if s[i] == '.' {
			dots++
		}
		i++
	}
	if i == 0 || s[0] == '.' || s[i-1] == '.' {
		return "", s
	}
	return s[:i], s[i:]
}

// scaleDecimal returns num × mult exactly, refusing a result that is not a
// whole number or does not fit in an int64.
func scaleDecimal(num string, mult int64) (int64, error) {
	intPart, frac, _ := strings.Cut(num, ".")
	digits, ok := new(big.Int).SetString(intPart+frac, 10)
	if !ok {
		return 0, quantityErr("bad number %s", Quote(num))
	}
	v := new(big.Int).Mul(digits, big.NewInt(mult))
	div := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(frac))), nil)
	q, r := new(big.Int).QuoRem(v, div, new(big.Int))
	if r.Sign() != 0 {
		return 0, quantityErr("%s × %d is not a whole number", num, mult)
	}
	if !q.IsInt64() {
		return 0, quantityErr("%s × %d is too large", num, mult)
	}
	return q.Int64(), nil
}

// PosError is an error at a YAML token, in the shape of goccy/go-yaml's
// own errors (yaml.Error), so that an error from a custom decoder comes
// back from the decoder with its position and a config loader can name
// the line. It unwraps to its cause (ErrBadQuantity for Size and Tokens).
type PosError struct {
	// Token is the offending value's token; nil when not known.
	Token *token.Token
	// Msg says what is wrong.
	Msg string
	// Err is the cause, or nil.
	Err error
}

// Error implements error.
func (e *PosError) Error() string { return e.Msg }

// Unwrap returns the cause.
func (e *PosError) Unwrap() error { return e.Err }

// GetToken returns the token (yaml.Error).
func (e *PosError) GetToken() *token.Token { return e.Token }

// GetMessage returns the message (yaml.Error).
func (e *PosError) GetMessage() string { return e.Msg }

// FormatError formats the message with the source around the token, as
// goccy/go-yaml formats its own errors (yaml.Error).
func (e *PosError) FormatError(colored, source bool) string {
	return yaml.FormatErrorWithToken(e.Msg, e.Token, colored, source)
}

var _ yaml.Error = (*PosError)(nil)

// NodeErr returns a *PosError at node with the message format (whose
// arguments must already be quoted with Quote where they come from the
// input) and the cause, which may be nil.
func NodeErr(node ast.Node, cause error, format string, args ...any) error {
	var tok *token.Token
	if node != nil {
		tok = node.GetToken()
	}
	return &PosError{Token: tok, Msg: fmt.Sprintf(format, args...), Err: cause}
}

func nodeErr(node ast.Node, cause error, format string, args ...any) error {
	if cause == nil {
		cause = ErrBadQuantity
	}
	return NodeErr(node, cause, format, args...)
}

// Describe names a YAML value for "want X, got Y" messages, quoting and
// clipping any text of the input.
func Describe(node ast.Node) string {
	if node == nil {
		return "nothing"
	}
	tok := node.GetToken()
	val := ""
	if tok != nil {
		val = tok.Value
	}
	switch node.Type() {
	case ast.NullType:
		return "null"
	case ast.MappingType, ast.MappingValueType:
		return "a mapping"
	case ast.SequenceType:
		return "a list"
	case ast.StringType, ast.LiteralType:
		return "the string " + Quote(val)
	}
	return node.Type().YAMLName() + " " + Clip(val, maxQuoted)
}

package quantity

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// maxQuoted is the most bytes of input Quote shows.
const maxQuoted = 64

// Quote returns s as a double-quoted string for an error message: control
// bytes, terminal escape sequences, invisible format characters and
// invalid UTF-8 are escaped as in Go ("\x1b", "\u202e", "\xff"), and at
// most 64 bytes of s are shown, followed by "…" and the length of s.
// Every value a config error copies from its input goes through Quote (or
// Clip), so an error message is bounded and never drives a terminal.
func Quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	n := appendEscaped(&b, s, maxQuoted, true)
	b.WriteByte('"')
	if n < len(s) {
		b.WriteString("… (")
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteString(" bytes)")
	}
	return b.String()
}

// Clip returns s with the same escapes as Quote but no quotes, cut after
// at most max bytes of s (then ending in "…"). Newlines are escaped too:
// call it on one line at a time to keep a multi-line excerpt readable.
func Clip(s string, max int) string {
	var b strings.Builder
	if n := appendEscaped(&b, s, max, false); n < len(s) {
		b.WriteString("…")
	}
	return b.String()
}

// appendEscaped writes the escaped form of s's first bytes, at most max
// of them (whole runes only), and returns how many bytes of s it used.
// With quoted, '"' and '\\' are escaped as well.
func appendEscaped(b *strings.Builder, s string, max int, quoted bool) int {
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if i+size > max {
			break
		}
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\x`)
			b.WriteString(hex2(s[i]))
		case quoted && (r == '"' || r == '\\'):
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\t' && !quoted:
			b.WriteRune(r)
		case !strconv.IsPrint(r):
			// QuoteRune gives the Go escape ('\x1b', '\u202e'); drop its
			// single quotes.
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return i
}

func hex2(c byte) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[c>>4], digits[c&0xf]})
}

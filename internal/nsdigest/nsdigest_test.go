package nsdigest

import (
	"crypto/sha256"
	"strings"
	"testing"
)

// TestEncoding pins the encoding: serve's doors persist state keyed by
// these digests (the store door's generations), so a change would lose it.
func TestEncoding(t *testing.T) {
	w := New("v1")
	w.Str("ab")
	w.Num(3)
	want := sha256.Sum256([]byte("\x02\x00\x00\x00\x00\x00\x00\x00v1" + "\x02\x00\x00\x00\x00\x00\x00\x00ab" + "\x03\x00\x00\x00\x00\x00\x00\x00"))
	if got := w.Sum(); got != want {
		t.Fatalf("digest %x, want %x", got, want)
	}
	// Where a string ends is part of the digest.
	a, b := New("v1"), New("v1")
	a.Str("ab")
	a.Str("c")
	b.Str("a")
	b.Str("bc")
	if a.Sum() == b.Sum() {
		t.Fatal(`"ab","c" and "a","bc" share a digest`)
	}
}

func TestCheckStrings(t *testing.T) {
	for _, c := range []struct {
		name   string
		fields []Field
		want   string
	}{
		{"none", nil, ""},
		{"at the bound", []Field{{"model", strings.Repeat("m", MaxString)}}, ""},
		{"over", []Field{{"model", "ok"}, {"salt", strings.Repeat("s", MaxString+1)}}, "namespace.salt: 257 bytes, at most 256"},
	} {
		err := CheckStrings(c.fields...)
		if (err == nil) != (c.want == "") || (err != nil && err.Error() != c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

package pagehash

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// docVector is one test vector of docs/page-hashes.md.
type docVector struct {
	line       int
	name       string
	pageTokens int
	tokens     []uint32
	hashes     []string
	none       bool
}

// parseVectors reads the ```vectors block of the page-hash document.
// Errors name the document line.
func parseVectors(path string) ([]docVector, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []docVector
	var cur *docVector
	in := false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "```vectors":
			in = true
			continue
		case !in:
			continue
		case l == "```":
			return out, nil
		case l == "":
			cur = nil
			continue
		case strings.HasPrefix(l, "#"):
			if cur == nil {
				out = append(out, docVector{line: n})
				cur = &out[len(out)-1]
			}
			cur.name = strings.TrimSpace(cur.name + " " + strings.TrimPrefix(l, "#"))
			continue
		}
		if cur == nil {
			out = append(out, docVector{line: n})
			cur = &out[len(out)-1]
		}
		key, val, ok := strings.Cut(l, ":")
		if !ok {
			return nil, fmt.Errorf("%s:%d: want \"key: value\", got %q", path, n, l)
		}
		val = strings.TrimSpace(val)
		switch {
		case key == "page_tokens":
			if cur.pageTokens, err = strconv.Atoi(val); err != nil {
				return nil, fmt.Errorf("%s:%d: page_tokens: %w", path, n, err)
			}
		case key == "tokens":
			if cur.tokens, err = parseTokens(val); err != nil {
				return nil, fmt.Errorf("%s:%d: tokens: %w", path, n, err)
			}
		case key == "hashes" && val == "none":
			cur.none = true
		case key == fmt.Sprintf("h[%d]", len(cur.hashes)):
			cur.hashes = append(cur.hashes, val)
		default:
			return nil, fmt.Errorf("%s:%d: unexpected key %q (next hash is h[%d])", path, n, key, len(cur.hashes))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("%s: no closed ```vectors block", path)
}

// parseTokens reads space-separated tokens and inclusive ranges a..b.
func parseTokens(s string) ([]uint32, error) {
	var out []uint32
	for _, f := range strings.Fields(s) {
		lo, hi, isRange := strings.Cut(f, "..")
		a, err := strconv.ParseUint(lo, 10, 32)
		if err != nil {
			return nil, err
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 32); err != nil {
				return nil, err
			}
			if b < a || b-a > 1<<20 {
				return nil, fmt.Errorf("bad range %q", f)
			}
		}
		for v := a; v <= b; v++ {
			out = append(out, uint32(v))
		}
	}
	return out, nil
}

// TestDocumentVectors checks every vector of docs/page-hashes.md against
// Chain, and that the vectors exercise what the document promises.
func TestDocumentVectors(t *testing.T) {
	path := filepath.Join("..", "docs", "page-hashes.md")
	vecs, err := parseVectors(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(vecs) < 5 {
		t.Fatalf("%s has %d vectors, want at least 5", path, len(vecs))
	}
	sizes := map[int]bool{}
	for _, v := range vecs {
		if v.pageTokens <= 0 || v.tokens == nil {
			t.Errorf("%s:%d (%s): incomplete vector", path, v.line, v.name)
			continue
		}
		if len(v.hashes) == 0 && !v.none {
			t.Errorf("%s:%d (%s): no hashes and no \"hashes: none\"", path, v.line, v.name)
		}
		sizes[v.pageTokens] = true
		got := Chain(nil, Root, v.tokens, v.pageTokens)
		if len(got) != len(v.hashes) {
			t.Errorf("%s:%d (%s): Chain gives %d hashes, document lists %d", path, v.line, v.name, len(got), len(v.hashes))
			continue
		}
		for i, h := range got {
			if h.String() != v.hashes[i] {
				t.Errorf("%s:%d (%s): h[%d] = %s, document says %s", path, v.line, v.name, i, h, v.hashes[i])
			}
		}
	}
	if !sizes[512] || len(sizes) < 3 {
		t.Errorf("vectors cover page sizes %v; want the default 512 and at least three sizes", sizes)
	}
}

package config

import (
	"bytes"
	"fmt"
	"io"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/scanner"
	"github.com/goccy/go-yaml/token"

	"github.com/kvtier/kvtier/quantity"
)

// Limits on a config's bytes and shape, checked on the bytes and tokens
// before the YAML parser builds a tree. A real stack config is a few
// kilobytes, nests about six levels and has tens of keys per mapping; the
// limits are far above that and far below what makes the parser slow:
// goccy/go-yaml's parser takes time quadratic in the keys of one block
// mapping and in the nesting depth (200 KB of nested lists took 54 s and
// 15 GB before these checks).
const (
	// MaxConfigBytes bounds a config's size; LoadFile reads no more than
	// this (plus one byte, to tell that there is more). The YAML scanner
	// reads a line whole, at about a second per MiB of short tokens here.
	MaxConfigBytes = 256 << 10
	// MaxDepth bounds the nesting of lists and mappings, block and flow
	// together.
	MaxDepth = 64
	// MaxMappingKeys bounds the keys of one block mapping.
	MaxMappingKeys = 1000
	// MaxDocuments bounds the document markers (--- and ...) of a config,
	// which is one document.
	MaxDocuments = 16
	// MaxTokens bounds the YAML tokens (keys, values, brackets, entries)
	// of a config: the default stack has about 150.
	MaxTokens = 20000
	// MaxValues bounds the values a config holds once its aliases are
	// expanded (*a stands for a whole copy of the value anchored &a), so
	// that nested aliases cannot blow a small file up exponentially.
	MaxValues = 100000
)

// utf8BOM is the byte-order mark some editors write at the start of a
// UTF-8 file; YAML allows it there, and it means nothing.
var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// stripBOM returns data without a leading UTF-8 byte-order mark.
func stripBOM(data []byte) []byte { return bytes.TrimPrefix(data, utf8BOM) }

// tokenize is goccy/go-yaml's lexer.Tokenize, stopping once it holds more
// than max tokens: lexing the rest of a file that is refused anyway would
// only cost time.
func tokenize(src string, max int) token.Tokens {
	var sc scanner.Scanner
	sc.Init(src)
	var toks token.Tokens
	for len(toks) <= max {
		sub, err := sc.Scan()
		if err == io.EOF {
			break
		}
		toks.Add(sub...)
	}
	return toks
}

// blockLevel is one open block collection in checkShape: a mapping (keys
// at col) or a sequence (entries "-" at col).
type blockLevel struct {
	col  int
	seq  bool
	keys int
}

// checkShape refuses tokens that nest deeper than MaxDepth, hold a block
// mapping of more than MaxMappingKeys keys or more than MaxDocuments
// document markers, naming the line and column where the limit is
// crossed. It runs in time linear in the tokens, and sees the structure
// only as far as the limits need: block levels by the columns of keys and
// "-" entries, flow levels by brackets.
func (s *source) checkShape(toks token.Tokens) *Error {
	var (
		block []blockLevel
		flow  int
		docs  int
		prev  *token.Token // the last token that is not a comment
	)
	fail := func(tk *token.Token, format string, args ...any) *Error {
		e := &Error{File: s.name, Msg: fmt.Sprintf(format, args...)}
		s.locate(e, tk)
		return e
	}
	tooDeep := func(tk *token.Token) *Error {
		return fail(tk, "lists and mappings nest deeper than %d levels here; a stack config needs fewer than ten", MaxDepth)
	}
	for i, tk := range toks {
		if i == MaxTokens {
			return fail(tk, "more than %d YAML tokens (keys, values, brackets); a stack config needs a few hundred", MaxTokens)
		}
		switch tk.Type {
		case token.CommentType:
			continue
		case token.DocumentHeaderType, token.DocumentEndType:
			if docs++; docs > MaxDocuments {
				return fail(tk, "more than %d document markers (--- or ...); a stack config is one document", MaxDocuments)
			}
			block, flow = block[:0], 0
		case token.SequenceStartType, token.MappingStartType:
			if flow++; flow+len(block) > MaxDepth {
				return tooDeep(tk)
			}
		case token.SequenceEndType, token.MappingEndType:
			if flow > 0 {
				flow--
			}
		case token.SequenceEntryType:
			if flow > 0 {
				break
			}
			col := tk.Position.Column
			for len(block) > 0 && block[len(block)-1].col > col {
				block = block[:len(block)-1]
			}
			if n := len(block); n > 0 && block[n-1].col == col && block[n-1].seq {
				break // the next entry of the same sequence
			}
			if block = append(block, blockLevel{col: col, seq: true}); len(block) > MaxDepth {
				return tooDeep(tk)
			}
		case token.MappingValueType:
			if flow > 0 || prev == nil {
				break
			}
			// The key is the token before the ':'; its column says which
			// mapping it belongs to. A key at the column of a sequence's
			// "-" ends that sequence.
			key := prev
			col := key.Position.Column
			for n := len(block); n > 0 && (block[n-1].col > col || (block[n-1].col == col && block[n-1].seq)); n = len(block) {
				block = block[:n-1]
			}
			n := len(block)
			if n == 0 || block[n-1].col != col {
				if block = append(block, blockLevel{col: col}); len(block)+flow > MaxDepth {
					return tooDeep(key)
				}
				n++
			}
			if block[n-1].keys++; block[n-1].keys > MaxMappingKeys {
				return fail(key, "key %s is key number %d of one mapping; a mapping may hold at most %d", quantity.Quote(key.Value), block[n-1].keys, MaxMappingKeys)
			}
		}
		prev = tk
	}
	return nil
}

// checkAliases refuses a config whose aliases expand it to more than
// MaxValues values, at the alias that crosses the limit, before anything
// decodes (and so copies) them. It counts each anchored value once and
// each alias by the size of its anchor, in time linear in the tree.
func (s *source) checkAliases(body ast.Node) *Error {
	anchors := map[string]int{}
	var over *token.Token
	var size func(n ast.Node) int
	size = func(n ast.Node) int {
		if n == nil || over != nil {
			return 0
		}
		total := 1
		switch n := n.(type) {
		case *ast.MappingNode:
			for _, v := range n.Values {
				total += size(v)
			}
		case *ast.MappingValueNode:
			total += size(n.Key) + size(n.Value)
		case *ast.MappingKeyNode:
			total += size(n.Value)
		case *ast.SequenceNode:
			for _, v := range n.Values {
				total += size(v)
			}
		case *ast.TagNode:
			total += size(n.Value)
		case *ast.AnchorNode:
			v := size(n.Value)
			if n.Name != nil {
				anchors[n.Name.GetToken().Value] = v
			}
			total += v
		case *ast.AliasNode:
			if n.Value != nil {
				total += anchors[n.Value.GetToken().Value]
			}
			if total > MaxValues {
				over = n.GetToken()
			}
		}
		return min(total, MaxValues+1)
	}
	if size(body) > MaxValues && over == nil {
		over = body.GetToken()
	}
	if over == nil {
		return nil
	}
	e := &Error{File: s.name, Msg: fmt.Sprintf("aliases expand the config to more than %d values here; a stack config holds a few hundred", MaxValues)}
	s.locate(e, over)
	return e
}

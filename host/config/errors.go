package config

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/token"

	"github.com/kvtier/kvtier/quantity"
)

// ErrInvalid is wrapped by every error about the content of a stack config
// (as opposed to failing to read the file).
var ErrInvalid = errors.New("invalid stack config")

// Error is a problem at one place of a stack config. Its message reads
//
//	stack.yaml:12:7: $.tiers[1].config.size: what is wrong
//	   11 |     config:
//	>  12 |       size: 64GB
//	              ^
//
// with the position and the annotated source when known (an error from
// Stack.Validate on a Stack built in code has only the path).
type Error struct {
	// File is the config's name as given to Load.
	File string
	// Line and Column are 1-based; 0 when not known.
	Line, Column int
	// Path is the YAML path of the offending value, e.g.
	// "$.tiers[1].config.size"; empty for a syntax error.
	Path string
	// Msg says what is wrong.
	Msg string
	// Source is the annotated excerpt of the config around Line, or "".
	Source string
	// Err is the underlying cause (for example registry.ErrNotFound for an
	// unknown module name), or nil.
	Err error
}

// Error implements error. Every part that can hold text of the config
// (file name, path, message, excerpt) is escaped and clipped, so the
// message is bounded and never carries control or terminal-escape bytes,
// however hostile the input.
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(quantity.Clip(e.File, maxNameBytes))
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d:%d", e.Line, e.Column)
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		fmt.Fprintf(&b, "line %d:%d: ", e.Line, e.Column)
	}
	if e.Path != "" {
		b.WriteString(quantity.Clip(e.Path, maxNameBytes))
		b.WriteString(": ")
	}
	b.WriteString(clipLines(e.Msg, maxMsgBytes))
	if e.Source != "" {
		b.WriteString("\n")
		b.WriteString(clipLines(e.Source, maxMsgBytes))
	}
	return b.String()
}

// Bounds of the parts of an error message.
const (
	maxNameBytes  = 256  // a file name or YAML path
	maxMsgBytes   = 2048 // a message or an excerpt
	excerptWidth  = 100  // bytes of one source line shown around the column
	excerptBefore = 2    // lines shown before the offending one
)

// clipLines escapes every line of s as quantity.Clip does, keeping the
// line breaks, and clips the whole to about max bytes of s.
func clipLines(s string, max int) string {
	var b strings.Builder
	for i, line := range strings.Split(s, "\n") {
		if max <= 0 {
			b.WriteString("\n…")
			break
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(quantity.Clip(line, max))
		max -= len(line) + 1
	}
	return b.String()
}

// Unwrap returns ErrInvalid and the cause, so errors.Is works with both.
func (e *Error) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrInvalid, e.Err}
	}
	return []error{ErrInvalid}
}

func nodeErr(node ast.Node, format string, args ...any) error {
	return quantity.NodeErr(node, nil, format, args...)
}

// describeNode names a YAML value for "want X, got Y" messages.
func describeNode(node ast.Node) string { return quantity.Describe(node) }

// source is a parsed config: its name, bytes and AST, used to turn paths
// and tokens into positions and annotated excerpts.
type source struct {
	name  string
	data  []byte // the config's bytes, for excerpts
	file  *ast.File
	lines int // lines in the config, to clamp positions the parser overshoots
}

// errAt returns an *Error at the YAML path, located in the source: the
// value at path, or, when it is absent (a missing field), the closest
// enclosing value that exists.
func (s *source) errAt(path string, cause error, format string, args ...any) *Error {
	e := &Error{File: s.name, Path: path, Msg: fmt.Sprintf(format, args...), Err: cause}
	if s.file == nil {
		return e
	}
	for p := path; p != ""; p = parentPath(p) {
		node := s.lookup(p)
		if node == nil {
			continue
		}
		tok := node.GetToken()
		if p != path {
			// The value at path is absent: point at the key that opens the
			// enclosing block ("model:"), not at its first entry.
			if k := s.keyOf(node); k != nil {
				tok = k
			}
		}
		s.locate(e, tok)
		break
	}
	return e
}

// keyOf returns the token of the mapping key whose value is node, or nil
// (the root, a list entry).
func (s *source) keyOf(node ast.Node) *token.Token {
	var key *token.Token
	v := visitor(func(n ast.Node) bool {
		if key != nil {
			return false
		}
		if mv, ok := n.(*ast.MappingValueNode); ok && mv.Value == node && mv.Key != nil {
			key = mv.Key.GetToken()
			return false
		}
		return true
	})
	for _, doc := range s.file.Docs {
		if doc.Body != nil {
			ast.Walk(v, doc.Body)
		}
	}
	return key
}

// lookup returns the node at path, or nil.
func (s *source) lookup(path string) ast.Node {
	if path == "$" {
		if len(s.file.Docs) == 0 || s.file.Docs[0].Body == nil {
			return nil
		}
		return s.file.Docs[0].Body
	}
	p, err := yaml.PathString(path)
	if err != nil {
		return nil
	}
	node, err := p.FilterFile(s.file)
	if err != nil {
		return nil
	}
	return node
}

func (s *source) locate(e *Error, tok *token.Token) {
	if tok == nil {
		return
	}
	e.Line, e.Column = tok.Position.Line, tok.Position.Column
	if s.lines > 0 && e.Line > s.lines {
		// NB: goccy/go-yaml reports some errors at end of input one line
		// past the last (found by FuzzLoad); name the last line instead.
		e.Line, e.Column = s.lines, 1
	}
	e.Source = s.excerpt(e.Line, e.Column)
}

// excerpt shows the config around line and column, in the layout of
// goccy/go-yaml's annotated errors:
//
//	   11 |     config:
//	>  12 |       size: 64GB
//	                    ^
//
// Lines are escaped (quantity.Clip) and a long line is shown only in a
// window of excerptWidth bytes around the column, so the excerpt is small
// whatever the config holds.
func (s *source) excerpt(line, col int) string {
	if line < 1 || len(s.data) == 0 {
		return ""
	}
	first := max(1, line-excerptBefore)
	// Find the start of line first, then cut the lines up to line.
	off := 0
	for n := 1; n < first; n++ {
		i := bytes.IndexByte(s.data[off:], '\n')
		if i < 0 {
			return ""
		}
		off += i + 1
	}
	lines := make([][]byte, 0, line-first+1)
	for n := first; n <= line; n++ {
		end := bytes.IndexByte(s.data[off:], '\n')
		if end < 0 {
			end = len(s.data) - off
		}
		lines = append(lines, bytes.TrimSuffix(s.data[off:off+end], []byte("\r")))
		off += end + 1
		if off > len(s.data) {
			break
		}
	}
	if len(lines) == 0 {
		return ""
	}
	last := lines[len(lines)-1]
	// The column counts characters; find its byte offset in the line.
	colOff := 0
	for c := 1; c < col && colOff < len(last); c++ {
		_, size := utf8.DecodeRune(last[colOff:])
		colOff += size
	}
	from := 0
	if colOff > excerptWidth/2 {
		from = colOff - excerptWidth/2
	}
	window := func(l []byte) (string, int) {
		lo := from
		if lo >= len(l) {
			lo = 0 // a shorter line around a long one: show its start
		}
		for lo > 0 && lo < len(l) && !utf8.RuneStart(l[lo]) {
			lo--
		}
		text := quantity.Clip(string(l[lo:]), excerptWidth)
		if lo > 0 {
			text = "…" + text
		}
		return text, lo
	}
	var b strings.Builder
	width := len(strconv.Itoa(line))
	for i, l := range lines {
		n := first + i
		mark := " "
		if n == line {
			mark = ">"
		}
		text, _ := window(l)
		fmt.Fprintf(&b, "%s%*d | %s\n", mark, max(width, 3), n, strings.TrimRight(text, " \t"))
	}
	_, lo := window(last)
	caret := utf8.RuneCountInString(quantity.Clip(string(last[lo:max(lo, colOff)]), excerptWidth))
	if lo > 0 {
		caret++ // the "…"
	}
	fmt.Fprintf(&b, "%s%s^", strings.Repeat(" ", max(width, 3)+4), strings.Repeat(" ", caret))
	return b.String()
}

// parentPath returns the path one level up: "$.a.b[2]" → "$.a.b",
// "$.a.b" → "$.a", "$" → "".
func parentPath(p string) string {
	if p == "$" || p == "" {
		return ""
	}
	i := strings.LastIndexAny(p, ".[")
	if i <= 0 {
		return "$"
	}
	return p[:i]
}

// fromDecode converts an error of the YAML parser or decoder into an
// *Error with position, path and a message for a person; target is the Go
// type decoded at rootPath, used to list the known fields of an unknown
// one.
func (s *source) fromDecode(err error, rootPath string, target reflect.Type) *Error {
	var ye yaml.Error
	if !errors.As(err, &ye) || ye.GetToken() == nil {
		return &Error{File: s.name, Path: rootPath, Msg: err.Error(), Err: err}
	}
	tok := ye.GetToken()
	node, path := s.nodeOfToken(tok)
	msg := ye.GetMessage()
	var (
		te  *yaml.TypeError
		ue  *yaml.UnknownFieldError
		oe  *yaml.OverflowError
		dup *yaml.DuplicateKeyError
		nt  *yaml.UnexpectedNodeTypeError
	)
	switch {
	case errors.As(err, &nt):
		msg = fmt.Sprintf("want %s, got %s", nodeTypeWord(nt.Expected), describeNode(node))
	case errors.As(err, &te):
		msg = fmt.Sprintf("want %s, got %s", describeType(te.DstType), describeNode(node))
	case errors.As(err, &oe):
		msg = fmt.Sprintf("%s does not fit in %s", oe.SrcNum, describeType(oe.DstType))
	case errors.As(err, &ue):
		if path == "" {
			path = rootPath
		}
		if known := knownFields(target, rootPath, parentPath(path)); len(known) > 0 {
			msg = fmt.Sprintf("%s (known: %s)", msg, strings.Join(known, ", "))
		}
	case errors.As(err, &dup):
		// goccy's message already names both positions.
	}
	e := &Error{File: s.name, Path: path, Msg: msg, Err: err}
	s.locate(e, tok)
	return e
}

// nodeOfToken finds the AST node that owns tok and its YAML path. For a
// mapping key it returns the path of the key's value, which is how a person
// names a field.
func (s *source) nodeOfToken(tok *token.Token) (ast.Node, string) {
	if s.file == nil {
		return nil, ""
	}
	var found ast.Node
	var path string
	v := visitor(func(n ast.Node) bool {
		if found != nil {
			return false
		}
		if mv, ok := n.(*ast.MappingValueNode); ok && mv.Key != nil && mv.Key.GetToken() == tok {
			found, path = mv.Key, mv.Value.GetPath()
			return false
		}
		if n.GetToken() == tok {
			found, path = n, n.GetPath()
			return false
		}
		return true
	})
	for _, doc := range s.file.Docs {
		if doc.Body != nil {
			ast.Walk(v, doc.Body)
		}
	}
	return found, path
}

type visitor func(ast.Node) bool

func (v visitor) Visit(n ast.Node) ast.Visitor {
	if v(n) {
		return v
	}
	return nil
}

// nodeTypeWord names a YAML node type with an article.
func nodeTypeWord(t ast.NodeType) string {
	switch t {
	case ast.MappingType:
		return "a mapping"
	case ast.SequenceType:
		return "a list"
	case ast.StringType:
		return "a string"
	case ast.IntegerType:
		return "an integer"
	}
	return t.YAMLName()
}

// describeType names a Go type in YAML words.
func describeType(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "a mapping"
	case reflect.Pointer:
		return describeType(t.Elem())
	}
	return t.String()
}

// knownFields returns the YAML field names of the struct found by
// following the path from rootPath (of Go type root) to structPath.
func knownFields(root reflect.Type, rootPath, structPath string) []string {
	if root == nil || !strings.HasPrefix(structPath, rootPath) {
		return nil
	}
	t := root
	rest := structPath[len(rootPath):]
	for t != nil {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if rest == "" {
			break
		}
		switch {
		case rest[0] == '[':
			end := strings.IndexByte(rest, ']')
			if end < 0 || (t.Kind() != reflect.Slice && t.Kind() != reflect.Array) {
				return nil
			}
			if _, err := strconv.Atoi(rest[1:end]); err != nil {
				return nil
			}
			t, rest = t.Elem(), rest[end+1:]
		case rest[0] == '.':
			rest = rest[1:]
			end := strings.IndexAny(rest, ".[")
			if end < 0 {
				end = len(rest)
			}
			name := rest[:end]
			rest = rest[end:]
			switch t.Kind() {
			case reflect.Map:
				t = t.Elem()
			case reflect.Struct:
				f, ok := fieldByYAMLName(t, name)
				if !ok {
					return nil
				}
				t = f
			default:
				return nil
			}
		default:
			return nil
		}
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	return yamlFieldNames(t)
}

// yamlName returns the YAML name of a struct field as goccy/go-yaml sees
// it (the tag name, or the lower-cased field name), and false for a field
// that is skipped.
func yamlName(f reflect.StructField) (string, bool) {
	if !f.IsExported() {
		return "", false
	}
	tag := f.Tag.Get("yaml")
	if tag == "-" {
		return "", false
	}
	name, _, _ := strings.Cut(tag, ",")
	if name == "" {
		name = strings.ToLower(f.Name)
	}
	return name, true
}

func fieldByYAMLName(t reflect.Type, name string) (reflect.Type, bool) {
	for i := range t.NumField() {
		if n, ok := yamlName(t.Field(i)); ok && n == name {
			return t.Field(i).Type, true
		}
	}
	return nil, false
}

func yamlFieldNames(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && strings.Contains(f.Tag.Get("yaml"), "inline") {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				out = append(out, yamlFieldNames(ft)...)
			}
			continue
		}
		if n, ok := yamlName(f); ok {
			out = append(out, n)
		}
	}
	return out
}

package config

import (
	"encoding"
	"fmt"
	"reflect"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"

	"github.com/kvtier/kvtier/quantity"
)

// selfDecoding are the interfaces by which a type decodes its own YAML; the
// unknown-field check leaves such a value to the type.
var selfDecoding = []reflect.Type{
	reflect.TypeFor[yaml.BytesUnmarshaler](),
	reflect.TypeFor[yaml.BytesUnmarshalerContext](),
	reflect.TypeFor[yaml.InterfaceUnmarshaler](),
	reflect.TypeFor[yaml.InterfaceUnmarshalerContext](),
	reflect.TypeFor[yaml.NodeUnmarshaler](),
	reflect.TypeFor[yaml.NodeUnmarshalerContext](),
	reflect.TypeFor[encoding.TextUnmarshaler](),
}

func decodesItself(t reflect.Type) bool {
	for _, i := range selfDecoding {
		if t.Implements(i) || reflect.PointerTo(t).Implements(i) {
			return true
		}
	}
	return false
}

// unknownField checks node against the Go type t the way strict decoding
// will, and returns an error at the first key, in file order, that names
// no field of its struct (nil if there is none).
//
// NB: goccy/go-yaml's strict decoding finds unknown keys too, but collects
// them in a Go map and names whichever the map yields first: a config
// with many unknown keys named a different one on each run. This walk
// makes the error deterministic and points at the first mistake.
func (s *source) unknownField(node ast.Node, t reflect.Type) *Error {
	key, val, st := firstUnknownField(node, t)
	if key == nil {
		return nil
	}
	name := keyName(key)
	msg := fmt.Sprintf("unknown field %s", quantity.Quote(name))
	if known := yamlFieldNames(st); len(known) > 0 {
		msg = fmt.Sprintf("%s (known: %s)", msg, strings.Join(known, ", "))
	}
	e := &Error{File: s.name, Path: val.GetPath(), Msg: msg}
	s.locate(e, key.GetToken())
	return e
}

// firstUnknownField returns the first unknown key under node for type t,
// the value it holds and the struct type it was looked up in, or nils.
func firstUnknownField(node ast.Node, t reflect.Type) (ast.MapKeyNode, ast.Node, reflect.Type) {
	for {
		switch n := node.(type) {
		case *ast.TagNode:
			node = n.Value
			continue
		case *ast.AnchorNode:
			node = n.Value
			continue
		}
		break
	}
	for t != nil && t.Kind() == reflect.Pointer {
		if decodesItself(t) {
			return nil, nil, nil
		}
		t = t.Elem()
	}
	if node == nil || t == nil || decodesItself(t) {
		return nil, nil, nil
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := node.(ast.MapNode)
		if !ok {
			return nil, nil, nil
		}
		fields := map[string]reflect.Type{}
		structFields(t, fields)
		for it := m.MapRange(); it.Next(); {
			key := it.Key()
			if key.IsMergeKey() {
				continue
			}
			ft, ok := fields[keyName(key)]
			if !ok {
				return key, it.Value(), t
			}
			if k, v, st := firstUnknownField(it.Value(), ft); k != nil {
				return k, v, st
			}
		}
	case reflect.Slice, reflect.Array:
		if seq, ok := node.(*ast.SequenceNode); ok {
			for _, v := range seq.Values {
				if k, val, st := firstUnknownField(v, t.Elem()); k != nil {
					return k, val, st
				}
			}
		}
	case reflect.Map:
		if m, ok := node.(ast.MapNode); ok {
			for it := m.MapRange(); it.Next(); {
				if k, v, st := firstUnknownField(it.Value(), t.Elem()); k != nil {
					return k, v, st
				}
			}
		}
	}
	return nil, nil, nil
}

// keyName is a mapping key's text as the decoder matches it to a field.
func keyName(key ast.MapKeyNode) string {
	if sn, ok := key.(*ast.StringNode); ok {
		return sn.Value
	}
	if tok := key.GetToken(); tok != nil {
		return tok.Value
	}
	return ""
}

// structFields adds the YAML names of t's fields to out, with their types,
// descending into inline fields as the decoder does.
func structFields(t reflect.Type, out map[string]reflect.Type) {
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && strings.Contains(f.Tag.Get("yaml"), "inline") {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				structFields(ft, out)
			}
			continue
		}
		if n, ok := yamlName(f); ok {
			out[n] = f.Type
		}
	}
}

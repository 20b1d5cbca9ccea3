package placement

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestLayoutValidate(t *testing.T) {
	kv := func(regions ...Region) KindLayout { return KindLayout{Name: "kv", PageBytes: 4096, Regions: regions} }
	tests := []struct {
		name    string
		layout  Layout
		wantErr string
	}{
		{"ok", Layout{Kinds: []KindLayout{kv(Region{Pages: 4})}}, ""},
		{"no kinds", Layout{}, "0 payload kinds"},
		{"no regions", Layout{Kinds: []KindLayout{kv()}}, "no regions"},
		{"empty region", Layout{Kinds: []KindLayout{kv(Region{Pages: 0})}}, "0 pages"},
		{"bad page bytes", Layout{Kinds: []KindLayout{{Name: "kv", Regions: []Region{{Pages: 1}}}}}, "page bytes 0"},
		{"overlap same kind", Layout{Kinds: []KindLayout{kv(Region{Pages: 4}, Region{Offset: 3 * 4096, Pages: 1})}}, "overlap"},
		{"overlap across kinds", Layout{Kinds: []KindLayout{kv(Region{Pages: 4}), {Name: "idx", PageBytes: 8, Regions: []Region{{Offset: 100, Pages: 1}}}}}, "overlap"},
		{"different slabs do not overlap", Layout{Kinds: []KindLayout{kv(Region{Pages: 4}, Region{Slab: 1, Pages: 4})}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.layout.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("Validate = %v, want an ErrInvalid containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestLayoutSpan(t *testing.T) {
	l := Layout{Kinds: []KindLayout{{Name: "kv", PageBytes: 100, Regions: []Region{{Slab: 0, Offset: 1000, Pages: 4}, {Slab: 3, Offset: 0, Pages: 2}}}}}
	tests := []struct {
		r       Range
		want    string
		wantErr bool
	}{
		{Range{Start: 0, Pages: 4}, "{0 1000 400}", false},
		{Range{Start: 4, Pages: 2}, "{3 0 200}", false},
		{Range{Start: 5, Pages: 1}, "{3 100 100}", false},
		{Range{Start: 3, Pages: 2}, "", true}, // straddles the region end
		{Range{Start: 6, Pages: 1}, "", true},
		{Range{Start: 1, Pages: 0}, "", true},
	}
	for _, tt := range tests {
		s, err := l.Span(0, tt.r)
		if tt.wantErr {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("Span(%+v) = %v, %v; want ErrInvalid", tt.r, s, err)
			}
			continue
		}
		if err != nil || fmt.Sprint(s) != tt.want {
			t.Errorf("Span(%+v) = %v, %v; want %s", tt.r, s, err, tt.want)
		}
	}
	if _, err := l.Span(1, Range{Pages: 1}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Span of unknown kind: %v, want ErrInvalid", err)
	}
}

func TestExhaustedErrorIs(t *testing.T) {
	a, _ := New(testLayouts()["tiny"])
	err := a.Reserve(1, 6, a.AllKinds())
	var ee *ExhaustedError
	if !errors.Is(err, ErrNoSpace) || !errors.As(err, &ee) || ee.Free != 5 || ee.Pages != 6 {
		t.Fatalf("Reserve over capacity = %v, want an *ExhaustedError with 5 free", err)
	}
}

package placement

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/tiers"
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

// TestPageSpansAppends: PageSpans appends one span per page after what dst
// holds, in page order, for objects of many ranges (a fragmented slab),
// equal to expanding Spans' runs one page at a time.
func TestPageSpansAppends(t *testing.T) {
	const seed = 7
	rng := rand.New(rand.NewPCG(seed, 0))
	a, err := New(Layout{Kinds: []KindLayout{{Name: "kv", PageBytes: 4096, Regions: []Region{{Slab: 0, Pages: 40}, {Slab: 1, Offset: 8192, Pages: 24}}}}})
	if err != nil {
		t.Fatal(err)
	}
	for id := ObjectID(1); id <= 64; id++ {
		if err := a.Reserve(id, 1, a.AllKinds()); err != nil {
			t.Fatal(err)
		}
	}
	// Free every other page, then reserve objects that must gather
	// ranges from the holes.
	for id := ObjectID(1); id <= 64; id += 2 {
		if err := a.Release(id); err != nil {
			t.Fatal(err)
		}
	}
	for id := ObjectID(100); a.FreePages(0) > 0; id++ {
		if err := a.Reserve(id, min(a.FreePages(0), 1+rng.Int64N(7)), a.AllKinds()); err != nil {
			t.Fatal(err)
		}
		prefix := []tiers.Span{{Slab: 9, Offset: 1, Length: 1}}
		got, err := a.PageSpans(id, 0, prefix)
		if err != nil {
			t.Fatal(err)
		}
		runs, err := a.Spans(id, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := append([]tiers.Span(nil), prefix...)
		for _, r := range runs {
			for off := int64(0); off < r.Length; off += 4096 {
				want = append(want, tiers.Span{Slab: r.Slab, Offset: r.Offset + off, Length: 4096})
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("seed %d: object %d (%d runs): PageSpans = %v, want %v", seed, id, len(runs), got, want)
		}
	}
}

// TestAppendRanges: AppendRanges appends what Object reports, after dst,
// and names an unknown object.
func TestAppendRanges(t *testing.T) {
	a, _ := New(testLayouts()["tiny"])
	if err := a.Reserve(1, 3, a.AllKinds()); err != nil {
		t.Fatal(err)
	}
	info, err := a.Object(1)
	if err != nil {
		t.Fatal(err)
	}
	got, err := a.AppendRanges([]Range{{Pages: 9}}, 1)
	if err != nil || fmt.Sprint(got[1:]) != fmt.Sprint(info.Ranges) || got[0].Pages != 9 {
		t.Fatalf("AppendRanges = %v, %v; want [{9}] + %v", got, err, info.Ranges)
	}
	if _, err := a.AppendRanges(nil, 2); !errors.Is(err, ErrUnknownObject) {
		t.Fatalf("AppendRanges of an unknown object: %v", err)
	}
}

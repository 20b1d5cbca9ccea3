package consensus

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

var testShape = Shape{Classes: 2, OKBits: 3, Reloads: 2}

func mk(tick uint64, s Shape, counts []Counts, ok []bool, prefix []uint32) Contribution {
	c := NewContribution(tick, s)
	copy(c.Counts, counts)
	copy(c.OK, ok)
	copy(c.Prefix, prefix)
	return c
}

func TestReduceTable(t *testing.T) {
	dShape := Shape{Classes: 1, Digest: true, Structures: int(NumStructures)}
	withDigest := func(d byte, structs ...byte) Contribution {
		c := NewContribution(5, dShape)
		c.Digest[0] = d
		for i, s := range structs {
			c.Structures[i][0] = s
		}
		return c
	}
	for _, tc := range []struct {
		name    string
		tick    uint64
		cs      []Contribution
		want    Frontier
		wantErr error
		msg     []string // substrings the error must contain
	}{
		{
			name: "min and and",
			tick: 7,
			cs: []Contribution{
				mk(7, testShape, []Counts{{5, 4, 3, 2}, {9, 9, 9, 9}}, []bool{true, true, false}, []uint32{4, 8}),
				mk(7, testShape, []Counts{{6, 2, 3, 7}, {1, 9, 9, 9}}, []bool{true, false, true}, []uint32{6, 2}),
			},
			want: Frontier(mk(7, testShape, []Counts{{5, 2, 3, 2}, {1, 9, 9, 9}}, []bool{true, false, false}, []uint32{4, 2})),
		},
		{
			name:    "one rank behind a tick",
			tick:    7,
			cs:      []Contribution{NewContribution(7, testShape), NewContribution(6, testShape)},
			wantErr: ErrTick, msg: []string{"rank 1", "tick 6"},
		},
		{
			name:    "another shape",
			tick:    7,
			cs:      []Contribution{NewContribution(7, testShape), NewContribution(7, Shape{Classes: 2, OKBits: 4, Reloads: 2})},
			wantErr: ErrShape, msg: []string{"rank 1", "tick 7", "ok=4"},
		},
		{
			name:    "vectors that do not fit the shape",
			tick:    1,
			cs:      []Contribution{NewContribution(1, testShape), {Tick: 1, Shape: testShape}},
			wantErr: ErrShape, msg: []string{"rank 1"},
		},
		{
			name:    "digest mismatch names the structure",
			tick:    5,
			cs:      []Contribution{withDigest(1, 1, 2, 3, 4), withDigest(1, 1, 2, 3, 4), withDigest(9, 1, 7, 3, 4)},
			wantErr: ErrDigestMismatch, msg: []string{"tick 5", "rank 0 digest 01", "rank 2 digest 09", "placement"},
		},
		{
			name:    "digest mismatch without structures",
			tick:    5,
			cs:      []Contribution{{Tick: 5, Shape: Shape{Digest: true}}, {Tick: 5, Shape: Shape{Digest: true}, Digest: Digest{2}}},
			wantErr: ErrDigestMismatch, msg: []string{"no per-structure digests"},
		},
		{name: "no contributions", tick: 1, wantErr: ErrShape},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Reduce(tc.tick, tc.cs)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got %v, want %v", err, tc.wantErr)
				}
				for _, m := range tc.msg {
					if !strings.Contains(err.Error(), m) {
						t.Errorf("error %q does not say %q", err, m)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !got.Equal(tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	var me *MismatchError
	_, err := Reduce(5, []Contribution{withDigest(1, 1, 2, 3, 4), withDigest(1, 1, 2, 9, 4)})
	if !errors.As(err, &me) || me.Structure != StructMarkers || me.RankB != 1 || me.Tick != 5 {
		t.Errorf("got %#v, want a mismatch on markers between ranks 0 and 1 at tick 5", err)
	}
}

// reference is the obvious element-wise reduction, the oracle.
func reference(cs []Contribution) Frontier {
	f := Frontier(NewContribution(cs[0].Tick, cs[0].Shape))
	f.Digest = cs[0].Digest
	copy(f.Structures, cs[0].Structures)
	for i := range f.Counts {
		f.Counts[i] = Counts{^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0)}
	}
	for i := range f.Prefix {
		f.Prefix[i] = ^uint32(0)
	}
	for _, c := range cs {
		for i, k := range c.Counts {
			f.Counts[i].Gathered = min(f.Counts[i].Gathered, k.Gathered)
			f.Counts[i].Durable = min(f.Counts[i].Durable, k.Durable)
			f.Counts[i].Reloaded = min(f.Counts[i].Reloaded, k.Reloaded)
			f.Counts[i].L1Copied = min(f.Counts[i].L1Copied, k.L1Copied)
		}
		for i, ok := range c.OK {
			f.OK[i] = f.OK[i] && ok
		}
		for i, p := range c.Prefix {
			f.Prefix[i] = min(f.Prefix[i], p)
		}
	}
	return f
}

func randomShape(rng *rand.Rand) Shape {
	s := Shape{Classes: rng.IntN(5), OKBits: rng.IntN(130), Reloads: rng.IntN(6), Digest: rng.IntN(3) == 0}
	if s.Digest && rng.IntN(2) == 0 {
		s.Structures = int(NumStructures)
	}
	return s
}

// TestReduceProperties: on 300 seeded cases the frontier equals the
// element-wise reference, and MIN/AND is commutative, associative and
// idempotent.
func TestReduceProperties(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, 12))
		s := randomShape(rng)
		tick := rng.Uint64N(1000)
		d := Digest{byte(seed)}
		cs := make([]Contribution, 1+rng.IntN(9))
		for i := range cs {
			cs[i] = RandomContribution(rng, tick, s, d)
		}
		f, err := Reduce(tick, cs)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if want := reference(cs); !f.Equal(want) {
			t.Fatalf("seed %d: frontier %+v, reference %+v", seed, f, want)
		}
		perm := append([]Contribution(nil), cs...)
		rng.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
		if g, _ := Reduce(tick, perm); !g.Equal(f) {
			t.Fatalf("seed %d: not commutative", seed)
		}
		k := rng.IntN(len(cs)) + 1
		left, _ := Reduce(tick, cs[:k])
		assoc := []Contribution{Contribution(left)}
		if k < len(cs) {
			right, _ := Reduce(tick, cs[k:])
			assoc = append(assoc, Contribution(right))
		}
		if g, err := Reduce(tick, assoc); err != nil || !g.Equal(f) {
			t.Fatalf("seed %d: not associative (split at %d): %v", seed, k, err)
		}
		if g, _ := Reduce(tick, []Contribution{Contribution(f), Contribution(f)}); !g.Equal(f) {
			t.Fatalf("seed %d: not idempotent", seed)
		}
		for r, c := range cs {
			if err := CheckFrontier(r, c, f); err != nil {
				t.Fatalf("seed %d: the frontier does not fit rank %d: %v", seed, r, err)
			}
		}
	}
}

func TestCheckFrontier(t *testing.T) {
	c := mk(3, testShape, []Counts{{5, 4, 3, 2}, {1, 1, 1, 1}}, []bool{true, false, true}, []uint32{4, 8})
	for _, tc := range []struct {
		name string
		mut  func(*Frontier)
		want error
	}{
		{"equal", func(*Frontier) {}, nil},
		{"tick", func(f *Frontier) { f.Tick++ }, ErrTick},
		{"shape", func(f *Frontier) { f.Shape.Reloads = 1; f.Prefix = f.Prefix[:1] }, ErrShape},
		{"counter above", func(f *Frontier) { f.Counts[1].Durable = 2 }, ErrShape},
		{"ok bit we failed", func(f *Frontier) { f.OK[1] = true }, ErrShape},
		{"prefix above", func(f *Frontier) { f.Prefix[0] = 5 }, ErrShape},
	} {
		f := Frontier(mk(3, testShape, c.Counts, c.OK, c.Prefix))
		tc.mut(&f)
		if err := CheckFrontier(2, c, f); !errors.Is(err, tc.want) || (err == nil) != (tc.want == nil) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestShapeValidate(t *testing.T) {
	for _, s := range []Shape{
		{Classes: -1}, {Classes: MaxClasses + 1}, {OKBits: MaxOKBits + 1}, {Reloads: -2},
		{Digest: true, Structures: 3}, {Structures: int(NumStructures)},
	} {
		if err := s.Validate(); !errors.Is(err, ErrShape) {
			t.Errorf("%+v: got %v, want ErrShape", s, err)
		}
	}
}

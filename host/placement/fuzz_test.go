package placement

import (
	"slices"
	"testing"
)

// decodeOps turns fuzz bytes into a layout choice and an op sequence: a
// first byte picks the layout, then each op takes four bytes (code, id,
// pages or split point, extra). Ids stay small so ops hit live objects.
func decodeOps(data []byte) (string, []op) {
	names := []string{"one-kind", "tiny", "two-kinds-multi-slab"}
	if len(data) == 0 {
		return names[0], nil
	}
	name := names[int(data[0])%len(names)]
	data = data[1:]
	var ops []op
	for len(data) >= 4 {
		c, id, n, x := data[0], ObjectID(data[1]%16), int64(data[2]%80), data[3]
		data = data[4:]
		kinds := Kinds(x>>4) & 3
		if kinds == 0 {
			kinds = 1
		}
		switch c % 7 {
		case 0, 1:
			ops = append(ops, op{code: 'r', id: id, pages: n, kinds: kinds})
		case 2:
			ops = append(ops, op{code: 'x', id: id})
		case 3:
			ops = append(ops, op{code: 'c', id: id})
		case 4:
			ops = append(ops, op{code: 's', id: id, at: n, prefix: ObjectID(x % 16)})
		case 5:
			var victims []ObjectID
			for v := ObjectID(0); v < 16; v++ {
				if x&(1<<(v%8)) != 0 && v != id {
					victims = append(victims, (v*7+ObjectID(x))%16)
				}
			}
			slices.Sort(victims)
			victims = slices.Compact(victims)
			ops = append(ops, op{code: 'e', id: id, pages: n, kinds: kinds, victims: victims})
		case 6:
			if x == 0xff {
				ops = append(ops, op{code: 'z'})
			}
		}
	}
	return name, ops
}

// FuzzOps applies arbitrary op sequences: no panic, the invariants hold
// after every op, and the state always equals the reference oracle's.
func FuzzOps(f *testing.F) {
	f.Add([]byte{0, 0, 1, 10, 0, 3, 1, 0, 0, 4, 1, 5, 2})
	f.Add([]byte{1, 0, 1, 2, 0, 0, 2, 2, 0, 3, 1, 0, 0, 3, 2, 0, 0, 5, 3, 3, 0x06})
	f.Add([]byte{2, 0, 1, 30, 0x30, 3, 1, 0, 0, 0, 2, 20, 0x10, 3, 2, 0, 0, 4, 1, 7, 9, 5, 4, 40, 0xff, 6, 0, 0, 0xff})
	f.Add([]byte{2, 0, 1, 79, 0x10, 0, 2, 79, 0x20, 2, 1, 0, 0, 0, 3, 60, 0x30})
	layouts := testLayouts()
	f.Fuzz(func(t *testing.T, data []byte) {
		name, ops := decodeOps(data)
		l := layouts[name]
		a, err := New(l)
		if err != nil {
			t.Fatal(err)
		}
		ref := newOracle(l)
		for i, o := range ops {
			n, err := o.apply(a)
			nRef, errRef := o.applyOracle(ref, l)
			if !sameErr(err, errRef) || n != nRef {
				t.Fatalf("%s op %d %v: allocator (%d, %v), oracle (%d, %v)", name, i, o, n, err, nRef, errRef)
			}
			if err := a.CheckInvariants(); err != nil {
				t.Fatalf("%s op %d %v: %v", name, i, o, err)
			}
			if err := ref.matches(a); err != nil {
				t.Fatalf("%s op %d %v: %v", name, i, o, err)
			}
		}
	})
}

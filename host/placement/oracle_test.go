package placement

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvtier/kvtier/tiers"
)

// oracle is the simple reference allocator the optimised one is checked
// against: one bool per page, first fit by linear scan. It implements the
// documented semantics and nothing else.
type oracle struct {
	total   []int64
	bounds  [][]int64
	used    [][]bool
	objects map[ObjectID]*oracleObject
}

type oracleObject struct {
	pages     int64
	kinds     Kinds
	committed bool
	// byKind[k] lists the object's pages of kind k in object order.
	byKind map[int][]int64
}

func newOracle(l Layout) *oracle {
	o := &oracle{objects: map[ObjectID]*oracleObject{}}
	for _, kl := range l.Kinds {
		var first int64
		var b []int64
		for i, r := range kl.Regions {
			if i > 0 {
				b = append(b, first)
			}
			first += r.Pages
		}
		o.total = append(o.total, first)
		o.bounds = append(o.bounds, b)
		o.used = append(o.used, make([]bool, first))
	}
	return o
}

// runs returns the maximal free runs of kind k, split at region bounds.
func (o *oracle) runs(k int) [][2]int64 {
	var out [][2]int64
	start := int64(-1)
	for p := int64(0); p <= o.total[k]; p++ {
		free := p < o.total[k] && !o.used[k][p]
		if free && start >= 0 && slices.Contains(o.bounds[k], p) {
			out = append(out, [2]int64{start, p - start})
			start = p
			continue
		}
		if free && start < 0 {
			start = p
		}
		if !free && start >= 0 {
			out = append(out, [2]int64{start, p - start})
			start = -1
		}
	}
	return out
}

func (o *oracle) freePages(k int) int64 {
	var n int64
	for _, u := range o.used[k] {
		if !u {
			n++
		}
	}
	return n
}

func (o *oracle) all() Kinds { return Kinds(1)<<len(o.total) - 1 }

func (o *oracle) reserve(id ObjectID, pages int64, kinds Kinds) error {
	if pages < 1 || kinds == 0 || kinds&^o.all() != 0 {
		return ErrInvalid
	}
	if _, ok := o.objects[id]; ok {
		return ErrExists
	}
	for k := range o.total {
		if kinds.Has(uint8k(k)) && o.freePages(k) < pages {
			return ErrNoSpace
		}
	}
	obj := &oracleObject{pages: pages, kinds: kinds, byKind: map[int][]int64{}}
	for k := range o.total {
		if !kinds.Has(uint8k(k)) {
			continue
		}
		runs := o.runs(k)
		took := false
		for _, r := range runs {
			if r[1] >= pages {
				for p := r[0]; p < r[0]+pages; p++ {
					o.used[k][p] = true
					obj.byKind[k] = append(obj.byKind[k], p)
				}
				took = true
				break
			}
		}
		for left := pages; !took && left > 0; {
			for _, r := range runs {
				n := min(r[1], left)
				for p := r[0]; p < r[0]+n; p++ {
					o.used[k][p] = true
					obj.byKind[k] = append(obj.byKind[k], p)
				}
				left -= n
				if left == 0 {
					break
				}
			}
		}
	}
	o.objects[id] = obj
	return nil
}

func (o *oracle) release(id ObjectID) error {
	obj, ok := o.objects[id]
	if !ok {
		return ErrUnknownObject
	}
	for k, pages := range obj.byKind {
		for _, p := range pages {
			o.used[k][p] = false
		}
	}
	delete(o.objects, id)
	return nil
}

func (o *oracle) commit(id ObjectID) error {
	obj, ok := o.objects[id]
	if !ok {
		return ErrUnknownObject
	}
	obj.committed = true
	return nil
}

func (o *oracle) split(id ObjectID, at int64, prefix ObjectID) error {
	obj, ok := o.objects[id]
	switch {
	case !ok:
		return ErrUnknownObject
	case !obj.committed:
		return ErrNotCommitted
	case at <= 0 || at >= obj.pages || prefix == id:
		return ErrInvalid
	}
	if _, ok := o.objects[prefix]; ok {
		return ErrExists
	}
	p := &oracleObject{pages: at, kinds: obj.kinds, committed: true, byKind: map[int][]int64{}}
	for k, pages := range obj.byKind {
		p.byKind[k] = append([]int64(nil), pages[:at]...)
		obj.byKind[k] = pages[at:]
	}
	obj.pages -= at
	o.objects[prefix] = p
	return nil
}

func (o *oracle) evictToFit(id ObjectID, pages int64, kinds Kinds, victims []ObjectID) (int, error) {
	if pages < 1 || kinds == 0 || kinds&^o.all() != 0 {
		return 0, ErrInvalid
	}
	if _, ok := o.objects[id]; ok {
		return 0, ErrExists
	}
	fitsNow := true
	for k := range o.total {
		if kinds.Has(uint8k(k)) && o.freePages(k) < pages {
			fitsNow = false
		}
	}
	if fitsNow {
		return 0, o.reserve(id, pages, kinds)
	}
	seen := map[ObjectID]bool{}
	for _, v := range victims {
		obj, ok := o.objects[v]
		switch {
		case v == id || seen[v]:
			return 0, ErrInvalid
		case !ok:
			return 0, ErrUnknownObject
		case !obj.committed:
			return 0, ErrNotCommitted
		}
		seen[v] = true
	}
	fits := func(extra []ObjectID) bool {
		for k := range o.total {
			if !kinds.Has(uint8k(k)) {
				continue
			}
			free := o.freePages(k)
			for _, v := range extra {
				free += int64(len(o.objects[v].byKind[k]))
			}
			if free < pages {
				return false
			}
		}
		return true
	}
	n := -1
	for i := 0; i <= len(victims); i++ {
		if fits(victims[:i]) {
			n = i
			break
		}
	}
	if n < 0 {
		return 0, ErrNoSpace
	}
	for _, v := range victims[:n] {
		_ = o.release(v)
	}
	return n, o.reserve(id, pages, kinds)
}

func uint8k(k int) tiers.PayloadKind { return tiers.PayloadKind(k) }

// matches reports the first difference between the allocator and the oracle.
func (o *oracle) matches(a *Allocator) error {
	if len(a.objects) != len(o.objects) {
		return fmt.Errorf("allocator has %d objects, oracle %d", len(a.objects), len(o.objects))
	}
	for id, want := range o.objects {
		got, err := a.Object(id)
		if err != nil {
			return fmt.Errorf("object %d: %w", id, err)
		}
		if got.Pages != want.pages || got.Kinds != want.kinds || got.Committed != want.committed {
			return fmt.Errorf("object %d: got pages %d kinds %v committed %v, oracle %d %v %v", id, got.Pages, got.Kinds, got.Committed, want.pages, want.kinds, want.committed)
		}
		gotPages := map[int][]int64{}
		for _, r := range got.Ranges {
			for p := r.Start; p < r.Start+r.Pages; p++ {
				gotPages[int(r.Kind)] = append(gotPages[int(r.Kind)], p)
			}
		}
		for k := range o.total {
			if !slices.Equal(gotPages[k], want.byKind[k]) {
				return fmt.Errorf("object %d kind %d: pages %v, oracle %v", id, k, gotPages[k], want.byKind[k])
			}
		}
	}
	for k := range o.total {
		var got [][2]int64
		a.free[k].walk(func(s, p int64) bool { got = append(got, [2]int64{s, p}); return true })
		if want := o.runs(k); !slices.Equal(got, want) {
			return fmt.Errorf("kind %d free ranges %v, oracle %v", k, got, want)
		}
	}
	return nil
}

// sameErr reports whether the allocator's error and the oracle's agree on
// the sentinel.
func sameErr(got, want error) bool {
	if want == nil || got == nil {
		return want == nil && got == nil
	}
	return errors.Is(got, want)
}

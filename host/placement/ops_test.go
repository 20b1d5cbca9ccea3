package placement

import (
	"fmt"
	"math/rand/v2"
)

// op is one allocator operation of a generated sequence.
type op struct {
	code    byte // 'r' reserve, 'x' release, 'c' commit, 's' split, 'e' evict-to-fit, 'z' reset
	id      ObjectID
	pages   int64
	kinds   Kinds
	at      int64
	prefix  ObjectID
	victims []ObjectID
}

func (o op) String() string {
	switch o.code {
	case 'r':
		return fmt.Sprintf("reserve id=%d pages=%d kinds=%v", o.id, o.pages, o.kinds)
	case 'x':
		return fmt.Sprintf("release id=%d", o.id)
	case 'c':
		return fmt.Sprintf("commit id=%d", o.id)
	case 's':
		return fmt.Sprintf("split id=%d at=%d prefix=%d", o.id, o.at, o.prefix)
	case 'e':
		return fmt.Sprintf("evict-to-fit id=%d pages=%d kinds=%v victims=%v", o.id, o.pages, o.kinds, o.victims)
	case 'z':
		return "reset"
	}
	return fmt.Sprintf("op %q", o.code)
}

// apply runs o on a and returns its error (and evicted count for 'e').
func (o op) apply(a *Allocator) (int, error) {
	switch o.code {
	case 'r':
		return 0, a.Reserve(o.id, o.pages, o.kinds)
	case 'x':
		return 0, a.Release(o.id)
	case 'c':
		return 0, a.Commit(o.id)
	case 's':
		return 0, a.Split(o.id, o.at, o.prefix)
	case 'e':
		return a.EvictToFit(o.id, o.pages, o.kinds, o.victims)
	case 'z':
		a.Reset()
		return 0, nil
	}
	return 0, fmt.Errorf("unknown op %q", o.code)
}

func (o op) applyOracle(m *oracle, l Layout) (int, error) {
	switch o.code {
	case 'r':
		return 0, m.reserve(o.id, o.pages, o.kinds)
	case 'x':
		return 0, m.release(o.id)
	case 'c':
		return 0, m.commit(o.id)
	case 's':
		return 0, m.split(o.id, o.at, o.prefix)
	case 'e':
		return m.evictToFit(o.id, o.pages, o.kinds, o.victims)
	case 'z':
		*m = *newOracle(l)
		return 0, nil
	}
	return 0, fmt.Errorf("unknown op %q", o.code)
}

// opGen draws operations that are mostly valid against the state it
// tracks (it keeps a shadow allocator), with some deliberate mistakes.
type opGen struct {
	r      *rand.Rand
	shadow *Allocator
	nextID ObjectID
	maxPg  int64
}

func newOpGen(seed uint64, l Layout) *opGen {
	a, err := New(l)
	if err != nil {
		panic(err)
	}
	return &opGen{r: rand.New(rand.NewPCG(seed, seed^0x5eed)), shadow: a, nextID: 1, maxPg: max(1, a.total[0]/4)}
}

func (g *opGen) liveIDs(committedOnly bool) []ObjectID {
	ids := make([]ObjectID, 0, len(g.shadow.objects))
	for id := ObjectID(1); id < g.nextID; id++ {
		if o, ok := g.shadow.objects[id]; ok && (!committedOnly || o.committed) {
			ids = append(ids, id)
		}
	}
	return ids
}

func (g *opGen) kinds() Kinds {
	if g.r.IntN(4) == 0 {
		return Kinds(1 + g.r.Uint64N(uint64(g.shadow.all)))
	}
	return g.shadow.all
}

func (g *opGen) next() op {
	var o op
	pick := func(ids []ObjectID) ObjectID {
		if len(ids) == 0 || g.r.IntN(20) == 0 {
			return ObjectID(g.r.IntN(int(g.nextID) + 2)) // maybe unknown
		}
		return ids[g.r.IntN(len(ids))]
	}
	switch n := g.r.IntN(100); {
	case n < 35:
		o = op{code: 'r', id: g.nextID, pages: 1 + g.r.Int64N(g.maxPg), kinds: g.kinds()}
		g.nextID++
	case n < 55:
		o = op{code: 'x', id: pick(g.liveIDs(false))}
	case n < 75:
		o = op{code: 'c', id: pick(g.liveIDs(false))}
	case n < 87:
		id := pick(g.liveIDs(true))
		at := int64(1)
		if obj, ok := g.shadow.objects[id]; ok && obj.pages > 1 {
			at = 1 + g.r.Int64N(obj.pages-1)
		}
		if g.r.IntN(10) == 0 {
			at = g.r.Int64N(3) - 1 // edge: 0, -1 or 1
		}
		o = op{code: 's', id: id, at: at, prefix: g.nextID}
		g.nextID++
	case n < 99:
		ids := g.liveIDs(true)
		g.r.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		o = op{code: 'e', id: g.nextID, pages: 1 + g.r.Int64N(2*g.maxPg), kinds: g.kinds(), victims: ids}
		g.nextID++
	default:
		o = op{code: 'z'}
	}
	if _, err := o.apply(g.shadow); err != nil {
		_ = err // expected errors are part of the stream
	}
	return o
}

package indextest

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvtier/kvtier/indexes"
)

// Metamorphic drives one random operation stream, generated from seed, on
// a and b and on a map kept as the oracle, and fails on the first step
// where any of the three answers differently. Both indexes must start
// empty. Keys come from a small pool so that puts replace, deletes hit and
// DeleteIf sees both matching and stale records.
func Metamorphic(t *testing.T, seed uint64, steps int, a, b indexes.Index) {
	t.Helper()
	if err := metamorphic(seed, steps, a, b); err != nil {
		t.Fatalf("metamorphic seed %#x: %v", seed, err)
	}
}

type oracle map[indexes.Key]indexes.Record

func metamorphic(seed uint64, steps int, a, b indexes.Index) error {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 0x6d6574616d6f7270))
	pool := make([]indexes.Key, 200)
	for i := range pool {
		pool[i] = RandomKey(rng, 3)
	}
	pick := func(n int) []indexes.Key {
		keys := make([]indexes.Key, n)
		for i := range keys {
			keys[i] = pool[rng.IntN(len(pool))]
		}
		return keys
	}
	model := oracle{}
	ixs := []indexes.Index{a, b}
	names := []string{"a", "b"}
	for step := range steps {
		n := rng.IntN(24) // 0 is an empty batch, on purpose
		switch op := rng.IntN(100); {
		case op < 30: // put
			entries := make([]indexes.Entry, n)
			for i, k := range pick(n) {
				entries[i] = indexes.Entry{Key: k, Record: RandomRecord(rng, k)}
				model[k] = entries[i].Record
			}
			for i, ix := range ixs {
				if err := ix.Put(ctx, entries); err != nil {
					return fmt.Errorf("step %d: put %d on %s: %w", step, n, names[i], err)
				}
			}
		case op < 55: // get
			keys := pick(n)
			want := make([]indexes.Record, n)
			wantFound := make([]bool, n)
			for i, k := range keys {
				want[i], wantFound[i] = model[k]
			}
			for i, ix := range ixs {
				got := make([]indexes.Record, n)
				found := make([]bool, n)
				if err := ix.Get(ctx, keys, got, found); err != nil {
					return fmt.Errorf("step %d: get %d on %s: %w", step, n, names[i], err)
				}
				for j := range keys {
					if found[j] != wantFound[j] || got[j] != want[j] {
						return fmt.Errorf("step %d: get %s on %s = %+v found=%v, oracle %+v found=%v",
							step, keys[j], names[i], got[j], found[j], want[j], wantFound[j])
					}
				}
			}
		case op < 67: // delete
			keys := pick(n)
			for _, k := range keys {
				delete(model, k)
			}
			for i, ix := range ixs {
				if err := ix.Delete(ctx, keys); err != nil {
					return fmt.Errorf("step %d: delete %d on %s: %w", step, n, names[i], err)
				}
			}
		case op < 80: // delete-if, half with the current record, half stale
			entries := make([]indexes.Entry, n)
			want := make([]bool, n)
			for i, k := range pick(n) {
				rec, ok := model[k]
				switch {
				case ok && rng.IntN(2) == 0:
					rec.LastAccess = rng.Uint64() // not part of the condition
				case ok && rng.IntN(2) == 0:
					rec.Slot ^= 1 << rng.IntN(8) // a stale location
				default:
					rec = RandomRecord(rng, k)
				}
				entries[i] = indexes.Entry{Key: k, Record: rec}
				if cur, ok := model[k]; ok && cur.SameLocation(rec) {
					want[i] = true
					delete(model, k)
				}
			}
			for i, ix := range ixs {
				deleted := make([]bool, n)
				if err := ix.DeleteIf(ctx, entries, deleted); err != nil {
					return fmt.Errorf("step %d: delete-if %d on %s: %w", step, n, names[i], err)
				}
				if !slices.Equal(deleted, want) {
					return fmt.Errorf("step %d: delete-if on %s deleted %v, oracle %v", step, names[i], deleted, want)
				}
			}
		case op < 92: // touch
			keys := pick(n)
			at := rng.Uint64()
			for _, k := range keys {
				if rec, ok := model[k]; ok {
					rec.LastAccess = at
					model[k] = rec
				}
			}
			for i, ix := range ixs {
				if err := ix.Touch(ctx, keys, at); err != nil {
					return fmt.Errorf("step %d: touch %d on %s: %w", step, n, names[i], err)
				}
			}
		default: // iterate and stats
			keys := slices.SortedFunc(maps.Keys(model), CompareKeys)
			for i, ix := range ixs {
				j := 0
				err := ix.Iterate(ctx, func(e indexes.Entry) error {
					if j >= len(keys) {
						return fmt.Errorf("extra entry %s", e.Key)
					}
					if e.Key != keys[j] || e.Record != model[keys[j]] {
						return fmt.Errorf("entry %d = %s %+v, oracle %s %+v", j, e.Key, e.Record, keys[j], model[keys[j]])
					}
					j++
					return nil
				})
				if err != nil {
					return fmt.Errorf("step %d: iterate on %s: %w", step, names[i], err)
				}
				if j != len(keys) {
					return fmt.Errorf("step %d: iterate on %s yielded %d entries, oracle %d", step, names[i], j, len(keys))
				}
				st, err := ix.Stats(ctx)
				if err != nil {
					return fmt.Errorf("step %d: stats on %s: %w", step, names[i], err)
				}
				if st.Entries != int64(len(model)) {
					return fmt.Errorf("step %d: stats on %s: %d entries, oracle %d", step, names[i], st.Entries, len(model))
				}
			}
		}
	}
	return nil
}

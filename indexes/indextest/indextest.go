// Package indextest is the conformance suite of Index v1. Every
// implementation — in-process or plugin, ours or a third party's — runs it
// unchanged from its own tests:
//
//	func TestConformance(t *testing.T) {
//		indextest.Run(t, func(t *testing.T) indexes.Index { return openFresh(t) })
//	}
//
// Run checks the contract of indexes.Index on fresh, empty indexes;
// RunDurable checks that what a batch wrote survives Close and reopen;
// Metamorphic drives one seeded random operation stream on two indexes (and
// a map kept as the oracle) and fails on the first differing answer.
//
// The suite only uses the Index interface: it must never reach into an
// implementation, and it never sleeps to make a race come out one way.
package indextest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/pagehash"
)

// Seed is the base seed of every random choice the suite makes. Each test
// derives its own generator from it and prints the seed when it fails.
const Seed = 0x6b76746965722d69

// LargeBatch is the size of the single batch the large-batch test writes.
const LargeBatch = 20000

// Opener opens a fresh, empty index for one subtest. It registers its own
// cleanup (the suite closes the index itself; a second Close must be
// harmless).
type Opener func(t *testing.T) indexes.Index

// DurableOpener opens the index kept in dir, creating it when dir is empty.
// The suite calls it several times on the same dir, closing the previous
// index first.
type DurableOpener func(t *testing.T, dir string) indexes.Index

// Run runs the conformance suite against indexes made by open.
func Run(t *testing.T, open Opener) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, ix indexes.Index)
	}{
		{"PutGet", testPutGet},
		{"PutReplaces", testPutReplaces},
		{"PutDuplicateKeysLastWins", testPutDuplicates},
		{"AbsentKeys", testAbsent},
		{"Delete", testDelete},
		{"DeleteIf", testDeleteIf},
		{"Touch", testTouch},
		{"KindsAreDistinctKeys", testKinds},
		{"IterateOrder", testIterateOrder},
		{"IterateStopsOnError", testIterateStop},
		{"IterateSnapshot", testIterateSnapshot},
		{"EmptyBatches", testEmptyBatches},
		{"MismatchedLengths", testMismatchedLengths},
		{"CanceledContext", testCanceled},
		{"Stats", testStats},
		{"LargeBatch", testLargeBatch},
		{"ConcurrentReadersOneWriter", testConcurrent},
		{"Closed", testClosed},
		{"CloseDuringIterate", testCloseDuringIterate},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix := open(t)
			t.Cleanup(func() { _ = ix.Close() })
			tt.fn(t, ix)
		})
	}
}

// RunDurable checks that batches survive Close and reopen of the index in
// one directory.
func RunDurable(t *testing.T, open DurableOpener) {
	t.Helper()
	t.Run("ReopenKeepsBatches", func(t *testing.T) {
		dir := t.TempDir()
		ctx := context.Background()
		rng := newRand(t, 11)
		entries := randomEntries(rng, 500)

		ix := open(t, dir)
		mustPut(t, ix, entries)
		mustClose(t, ix)

		ix = open(t, dir)
		expectEntries(t, ix, entries)
		// Delete the first 100, touch the next 100, replace the next 100.
		mustDelete(t, ix, keysOf(entries[:100]))
		if err := ix.Touch(ctx, keysOf(entries[100:200]), 999); err != nil {
			t.Fatalf("touch: %v", err)
		}
		for i := 200; i < 300; i++ {
			entries[i].Record.Slot += 1_000_000
		}
		mustPut(t, ix, entries[200:300])
		mustClose(t, ix)

		ix = open(t, dir)
		defer mustClose(t, ix)
		want := slices.Clone(entries[100:])
		for i := range 100 {
			want[i].Record.LastAccess = 999
		}
		expectEntries(t, ix, want)
		expectAbsent(t, ix, keysOf(entries[:100]))
	})
	t.Run("ReopenEmpty", func(t *testing.T) {
		dir := t.TempDir()
		ix := open(t, dir)
		mustClose(t, ix)
		ix = open(t, dir)
		defer mustClose(t, ix)
		expectEntries(t, ix, nil)
	})
}

// newRand returns the generator of one test, derived from Seed and salt,
// and arranges for the seed to be printed if the test fails.
func newRand(t *testing.T, salt uint64) *rand.Rand {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("indextest seed: %#x salt %d", uint64(Seed), salt)
		}
	})
	return rand.New(rand.NewPCG(Seed, salt))
}

// RandomKey returns a key with a random hash and a kind in [0, kinds).
func RandomKey(rng *rand.Rand, kinds int) indexes.Key {
	var h pagehash.Hash
	for i := 0; i < len(h); i += 8 {
		v := rng.Uint64()
		for j := range 8 {
			h[i+j] = byte(v >> (8 * j))
		}
	}
	return indexes.Key{Hash: h, Kind: uint8(rng.IntN(kinds))}
}

// RandomRecord returns a record for k with random location fields.
func RandomRecord(rng *rand.Rand, k indexes.Key) indexes.Record {
	return indexes.Record{
		Disk:       uint16(rng.IntN(4)),
		Kind:       k.Kind,
		Slot:       rng.Uint64N(1 << 40),
		Epoch:      rng.Uint64N(4),
		LastAccess: rng.Uint64(),
	}
}

func randomEntries(rng *rand.Rand, n int) []indexes.Entry {
	seen := make(map[indexes.Key]bool, n)
	out := make([]indexes.Entry, 0, n)
	for len(out) < n {
		k := RandomKey(rng, 3)
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, indexes.Entry{Key: k, Record: RandomRecord(rng, k)})
	}
	return out
}

// CompareKeys orders keys as EncodeKey does, the Iterate order.
func CompareKeys(a, b indexes.Key) int {
	if c := bytes.Compare(a.Hash[:], b.Hash[:]); c != 0 {
		return c
	}
	return cmp.Compare(a.Kind, b.Kind)
}

func keysOf(entries []indexes.Entry) []indexes.Key {
	out := make([]indexes.Key, len(entries))
	for i, e := range entries {
		out[i] = e.Key
	}
	return out
}

func mustPut(t *testing.T, ix indexes.Index, entries []indexes.Entry) {
	t.Helper()
	if err := ix.Put(context.Background(), entries); err != nil {
		t.Fatalf("put %d entries: %v", len(entries), err)
	}
}

func mustDelete(t *testing.T, ix indexes.Index, keys []indexes.Key) {
	t.Helper()
	if err := ix.Delete(context.Background(), keys); err != nil {
		t.Fatalf("delete %d keys: %v", len(keys), err)
	}
}

func mustClose(t *testing.T, ix indexes.Index) {
	t.Helper()
	if err := ix.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}

func get(t *testing.T, ix indexes.Index, keys []indexes.Key) ([]indexes.Record, []bool) {
	t.Helper()
	dst := make([]indexes.Record, len(keys))
	found := make([]bool, len(keys))
	if err := ix.Get(context.Background(), keys, dst, found); err != nil {
		t.Fatalf("get %d keys: %v", len(keys), err)
	}
	return dst, found
}

func iterate(t *testing.T, ix indexes.Index) []indexes.Entry {
	t.Helper()
	var out []indexes.Entry
	if err := ix.Iterate(context.Background(), func(e indexes.Entry) error {
		out = append(out, e)
		return nil
	}); err != nil {
		t.Fatalf("iterate: %v", err)
	}
	return out
}

// expectEntries asserts that the index holds exactly want (in any order of
// want), through Get, Iterate and Stats.
func expectEntries(t *testing.T, ix indexes.Index, want []indexes.Entry) {
	t.Helper()
	recs, found := get(t, ix, keysOf(want))
	for i, e := range want {
		if !found[i] {
			t.Fatalf("get %s: absent, want %+v", e.Key, e.Record)
		}
		if recs[i] != e.Record {
			t.Fatalf("get %s = %+v, want %+v", e.Key, recs[i], e.Record)
		}
	}
	sorted := slices.Clone(want)
	slices.SortFunc(sorted, func(a, b indexes.Entry) int { return CompareKeys(a.Key, b.Key) })
	got := iterate(t, ix)
	if len(got) != len(sorted) {
		t.Fatalf("iterate yielded %d entries, want %d", len(got), len(sorted))
	}
	for i := range got {
		if got[i] != sorted[i] {
			t.Fatalf("iterate entry %d = %s %+v, want %s %+v", i, got[i].Key, got[i].Record, sorted[i].Key, sorted[i].Record)
		}
	}
	st, err := ix.Stats(context.Background())
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	if st.Entries != int64(len(want)) {
		t.Fatalf("stats entries = %d, want %d", st.Entries, len(want))
	}
}

func expectAbsent(t *testing.T, ix indexes.Index, keys []indexes.Key) {
	t.Helper()
	recs, found := get(t, ix, keys)
	for i, k := range keys {
		if found[i] {
			t.Fatalf("get %s: found %+v, want absent", k, recs[i])
		}
		if recs[i] != (indexes.Record{}) {
			t.Fatalf("get %s: absent but dst holds %+v, want the zero record", k, recs[i])
		}
	}
}

func testPutGet(t *testing.T, ix indexes.Index) {
	rng := newRand(t, 1)
	for _, n := range []int{1, 2, 17, 256} {
		entries := randomEntries(rng, n)
		mustPut(t, ix, entries)
		expectEntries(t, ix, entries)
		mustDelete(t, ix, keysOf(entries))
	}
}

func testPutReplaces(t *testing.T, ix indexes.Index) {
	rng := newRand(t, 2)
	entries := randomEntries(rng, 64)
	mustPut(t, ix, entries)
	for i := range entries {
		entries[i].Record = RandomRecord(rng, entries[i].Key)
	}
	mustPut(t, ix, entries[:32])
	mustPut(t, ix, entries[32:])
	expectEntries(t, ix, entries)
}

func testPutDuplicates(t *testing.T, ix indexes.Index) {
	rng := newRand(t, 3)
	k := RandomKey(rng, 3)
	first := indexes.Entry{Key: k, Record: RandomRecord(rng, k)}
	last := indexes.Entry{Key: k, Record: RandomRecord(rng, k)}
	mustPut(t, ix, []indexes.Entry{first, last})
	expectEntries(t, ix, []indexes.Entry{last})
}

func testAbsent(t *testing.T, ix indexes.Index) {
	rng := newRand(t, 4)
	present := randomEntries(rng, 10)
	mustPut(t, ix, present)
	absent := keysOf(randomEntries(rng, 10))
	expectAbsent(t, ix, absent)
	// A lookup mixing present and absent keys answers each one, and
	// resets stale dst/found values for the absent ones.
	keys := append(keysOf(present), absent...)
	dst := make([]indexes.Record, len(keys))
	found := make([]bool, len(keys))
	for i := range keys {
		dst[i] = indexes.Record{Slot: 12345}
		found[i] = true
	}
	if err := ix.Get(context.Background(), keys, dst, found); err != nil {
		t.Fatalf("get: %v", err)
	}
	for i := range keys {
		wantFound := i < len(present)
		if found[i] != wantFound {
			t.Fatalf("key %d %s: found = %v, want %v", i, keys[i], found[i], wantFound)
		}
		if wantFound && dst[i] != present[i].Record {
			t.Fatalf("key %d %s = %+v, want %+v", i, keys[i], dst[i], present[i].Record)
		}
		if !wantFound && dst[i] != (indexes.Record{}) {
			t.Fatalf("absent key %d %s: dst = %+v, want zero", i, keys[i], dst[i])
		}
	}
	// Deleting and touching absent keys is not an error and creates nothing.
	mustDelete(t, ix, absent)
	if err := ix.Touch(context.Background(), absent, 5); err != nil {
		t.Fatalf("touch absent: %v", err)
	}
	expectEntries(t, ix, present)
}

func testDelete(t *testing.T, ix indexes.Index) {
	rng := newRand(t, 5)
	entries := randomEntries(rng, 100)
	mustPut(t, ix, entries)
	// Delete every third key, plus a key twice in the same batch.
	var del []indexes.Key
	var keep []indexes.Entry
	for i, e := range entries {
		if i%3 == 0 {
			del = append(del, e.Key)
		} else {
			keep = append(keep, e)
		}
	}
	del = append(del, del[0])
	mustDelete(t, ix, del)
	expectEntries(t, ix, keep)
	expectAbsent(t, ix, del)
}

func testDeleteIf(t *testing.T, ix indexes.Index) {
	rng := newRand(t, 6)
	entries := randomEntries(rng, 8)
	mustPut(t, ix, entries)
	absent := randomEntries(rng, 1)[0]

	cond := func(e indexes.Entry, mutate func(*indexes.Record)) indexes.Entry {
		mutate(&e.Record)
		return e
	}
	type tc struct {
		name  string
		entry indexes.Entry
		want  bool
	}
	cases := []tc{
		{"exact match", entries[0], true},
		{"other last access still matches", cond(entries[1], func(r *indexes.Record) { r.LastAccess++ }), true},
		{"other kind field still matches", cond(entries[2], func(r *indexes.Record) { r.Kind++ }), true},
		{"other disk", cond(entries[3], func(r *indexes.Record) { r.Disk++ }), false},
		{"other slot", cond(entries[4], func(r *indexes.Record) { r.Slot++ }), false},
		{"other epoch", cond(entries[5], func(r *indexes.Record) { r.Epoch++ }), false},
		{"absent key", absent, false},
	}
	batch := make([]indexes.Entry, len(cases))
	for i, c := range cases {
		batch[i] = c.entry
	}
	deleted := make([]bool, len(batch))
	for i := range deleted {
		deleted[i] = !cases[i].want // stale values must be overwritten
	}
	if err := ix.DeleteIf(context.Background(), batch, deleted); err != nil {
		t.Fatalf("delete-if: %v", err)
	}
	var remain []indexes.Entry
	for i, c := range cases {
		if deleted[i] != c.want {
			t.Errorf("%s: deleted = %v, want %v", c.name, deleted[i], c.want)
		}
		if !c.want && c.name != "absent key" {
			remain = append(remain, entries[i])
		}
	}
	remain = append(remain, entries[6:]...)
	expectEntries(t, ix, remain)

	// A key named twice in one batch is deleted by the first matching
	// entry; the second sees it absent.
	deleted = make([]bool, 2)
	if err := ix.DeleteIf(context.Background(), []indexes.Entry{entries[6], entries[6]}, deleted); err != nil {
		t.Fatalf("delete-if twice: %v", err)
	}
	if !deleted[0] || deleted[1] {
		t.Fatalf("delete-if of one key twice: deleted = %v, want [true false]", deleted)
	}
	// The stale-reader case: a newer record replaced the one the caller
	// saw, so the caller's DeleteIf must leave the newer one alone.
	old := entries[7]
	newer := old
	newer.Record.Slot += 7
	mustPut(t, ix, []indexes.Entry{newer})
	deleted = make([]bool, 1)
	if err := ix.DeleteIf(context.Background(), []indexes.Entry{old}, deleted); err != nil {
		t.Fatalf("delete-if stale: %v", err)
	}
	if deleted[0] {
		t.Fatalf("delete-if with a stale record deleted the newer record")
	}
	expectEntries(t, ix, append(remain[:len(remain)-2], newer))
}

func testTouch(t *testing.T, ix indexes.Index) {
	rng := newRand(t, 7)
	entries := randomEntries(rng, 20)
	mustPut(t, ix, entries)
	absent := keysOf(randomEntries(rng, 3))
	keys := append(keysOf(entries[:10]), absent...)
	keys = append(keys, entries[0].Key) // a key touched twice
	if err := ix.Touch(context.Background(), keys, 424242); err != nil {
		t.Fatalf("touch: %v", err)
	}
	for i := range 10 {
		entries[i].Record.LastAccess = 424242
	}
	expectEntries(t, ix, entries)
	expectAbsent(t, ix, absent)
	// Touch sets, it does not take the maximum: an older time is stored.
	if err := ix.Touch(context.Background(), keysOf(entries[:1]), 3); err != nil {
		t.Fatalf("touch back: %v", err)
	}
	entries[0].Record.LastAccess = 3
	expectEntries(t, ix, entries)
}

func testKinds(t *testing.T, ix indexes.Index) {
	rng := newRand(t, 8)
	k := RandomKey(rng, 1)
	var entries []indexes.Entry
	for kind := range 4 {
		kk := indexes.Key{Hash: k.Hash, Kind: uint8(kind)}
		entries = append(entries, indexes.Entry{Key: kk, Record: RandomRecord(rng, kk)})
	}
	kk := indexes.Key{Hash: k.Hash, Kind: 255}
	entries = append(entries, indexes.Entry{Key: kk, Record: RandomRecord(rng, kk)})
	mustPut(t, ix, entries)
	expectEntries(t, ix, entries)
	mustDelete(t, ix, []indexes.Key{entries[1].Key})
	expectEntries(t, ix, append(slices.Clone(entries[:1]), entries[2:]...))
}

func testIterateOrder(t *testing.T, ix indexes.Index) {
	rng := newRand(t, 9)
	entries := randomEntries(rng, 300)
	// Keys sharing a hash prefix exercise the byte order beyond byte 0.
	base := RandomKey(rng, 1)
	for i := range 20 {
		k := base
		k.Hash[31] = byte(255 - i)
		k.Kind = uint8(i % 3)
		entries = append(entries, indexes.Entry{Key: k, Record: RandomRecord(rng, k)})
	}
	mustPut(t, ix, entries)
	got := iterate(t, ix)
	if !slices.IsSortedFunc(got, func(a, b indexes.Entry) int { return CompareKeys(a.Key, b.Key) }) {
		t.Fatalf("iterate is not in key order")
	}
	for i := 1; i < len(got); i++ {
		var a, b [indexes.KeySize]byte
		indexes.EncodeKey(&a, got[i-1].Key)
		indexes.EncodeKey(&b, got[i].Key)
		if bytes.Compare(a[:], b[:]) >= 0 {
			t.Fatalf("iterate entries %d and %d out of encoded-key order", i-1, i)
		}
	}
	expectEntries(t, ix, entries)
}

func testIterateStop(t *testing.T, ix indexes.Index) {
	rng := newRand(t, 10)
	mustPut(t, ix, randomEntries(rng, 50))
	stop := errors.New("stop here")
	calls := 0
	err := ix.Iterate(context.Background(), func(indexes.Entry) error {
		calls++
		if calls == 5 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Fatalf("iterate error = %v, want the callback's error", err)
	}
	if calls != 5 {
		t.Fatalf("callback ran %d times after returning an error at call 5", calls)
	}
}

func testIterateSnapshot(t *testing.T, ix indexes.Index) {
	rng := newRand(t, 12)
	before := randomEntries(rng, 200)
	mustPut(t, ix, before)
	added := randomEntries(rng, 50)
	var got []indexes.Entry
	var writeErr error
	err := ix.Iterate(context.Background(), func(e indexes.Entry) error {
		if len(got) == 0 {
			// Rewrite the index from another goroutine while this
			// iteration is in flight, and wait for it to finish: the
			// iteration must still see only the snapshot it started on.
			var wg sync.WaitGroup
			wg.Go(func() {
				ctx := context.Background()
				if err := ix.Delete(ctx, keysOf(before[:100])); err != nil {
					writeErr = err
					return
				}
				if err := ix.Put(ctx, added); err != nil {
					writeErr = err
					return
				}
				writeErr = ix.Touch(ctx, keysOf(before[100:]), 1)
			})
			wg.Wait()
		}
		got = append(got, e)
		return nil
	})
	if err != nil {
		t.Fatalf("iterate: %v", err)
	}
	if writeErr != nil {
		t.Fatalf("write during iterate: %v", writeErr)
	}
	want := slices.Clone(before)
	slices.SortFunc(want, func(a, b indexes.Entry) int { return CompareKeys(a.Key, b.Key) })
	if !slices.Equal(got, want) {
		t.Fatalf("iterate during writes yielded %d entries not equal to the %d of its snapshot", len(got), len(want))
	}
	after := slices.Clone(before[100:])
	for i := range after {
		after[i].Record.LastAccess = 1
	}
	expectEntries(t, ix, append(after, added...))
}

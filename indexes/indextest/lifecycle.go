package indextest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/indexes"
)

func testEmptyBatches(t *testing.T, ix indexes.Index) {
	ctx := context.Background()
	checks := []struct {
		name string
		fn   func() error
	}{
		{"put nil", func() error { return ix.Put(ctx, nil) }},
		{"put empty", func() error { return ix.Put(ctx, []indexes.Entry{}) }},
		{"get nil", func() error { return ix.Get(ctx, nil, nil, nil) }},
		{"delete nil", func() error { return ix.Delete(ctx, nil) }},
		{"delete-if nil", func() error { return ix.DeleteIf(ctx, nil, nil) }},
		{"touch nil", func() error { return ix.Touch(ctx, nil, 1) }},
	}
	for _, c := range checks {
		if err := c.fn(); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	expectEntries(t, ix, nil)
}

func testMismatchedLengths(t *testing.T, ix indexes.Index) {
	ctx := context.Background()
	rng := newRand(t, 13)
	entries := randomEntries(rng, 4)
	mustPut(t, ix, entries)
	keys := keysOf(entries)
	if err := ix.Get(ctx, keys, make([]indexes.Record, 3), make([]bool, 4)); !errors.Is(err, indexes.ErrInvalid) {
		t.Errorf("get with 3 records for 4 keys: %v, want ErrInvalid", err)
	}
	if err := ix.Get(ctx, keys, make([]indexes.Record, 4), make([]bool, 5)); !errors.Is(err, indexes.ErrInvalid) {
		t.Errorf("get with 5 found flags for 4 keys: %v, want ErrInvalid", err)
	}
	if err := ix.DeleteIf(ctx, entries, make([]bool, 3)); !errors.Is(err, indexes.ErrInvalid) {
		t.Errorf("delete-if with 3 flags for 4 entries: %v, want ErrInvalid", err)
	}
	// Nothing was deleted by the refused batch.
	expectEntries(t, ix, entries)
}

func testCanceled(t *testing.T, ix indexes.Index) {
	rng := newRand(t, 14)
	entries := randomEntries(rng, 10)
	mustPut(t, ix, entries[:5])
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	keys := keysOf(entries)
	checks := []struct {
		name string
		fn   func() error
	}{
		{"put", func() error { return ix.Put(ctx, entries[5:]) }},
		{"get", func() error {
			return ix.Get(ctx, keys, make([]indexes.Record, len(keys)), make([]bool, len(keys)))
		}},
		{"delete", func() error { return ix.Delete(ctx, keys[:5]) }},
		{"delete-if", func() error { return ix.DeleteIf(ctx, entries[:5], make([]bool, 5)) }},
		{"touch", func() error { return ix.Touch(ctx, keys[:5], 77) }},
		{"iterate", func() error { return ix.Iterate(ctx, func(indexes.Entry) error { return nil }) }},
	}
	for _, c := range checks {
		if err := c.fn(); !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a canceled context: err = %v, want context.Canceled", c.name, err)
		}
	}
	// No write with a canceled context took effect.
	expectEntries(t, ix, entries[:5])
}

func testStats(t *testing.T, ix indexes.Index) {
	ctx := context.Background()
	rng := newRand(t, 15)
	st, err := ix.Stats(ctx)
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	if st.Entries != 0 || st.Bytes < 0 || st.CapacityBytes < 0 {
		t.Fatalf("stats of an empty index = %+v", st)
	}
	entries := randomEntries(rng, 1000)
	mustPut(t, ix, entries)
	st, err = ix.Stats(ctx)
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	if st.Entries != 1000 {
		t.Fatalf("stats entries after 1000 puts = %d", st.Entries)
	}
	if st.CapacityBytes != 0 && st.Bytes > st.CapacityBytes {
		t.Fatalf("stats bytes %d exceed capacity %d", st.Bytes, st.CapacityBytes)
	}
	mustDelete(t, ix, keysOf(entries[:400]))
	st, err = ix.Stats(ctx)
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	if st.Entries != 600 {
		t.Fatalf("stats entries after deleting 400 of 1000 = %d", st.Entries)
	}
}

func testLargeBatch(t *testing.T, ix indexes.Index) {
	rng := newRand(t, 16)
	entries := randomEntries(rng, LargeBatch)
	mustPut(t, ix, entries)
	expectEntries(t, ix, entries)
	deleted := make([]bool, len(entries))
	if err := ix.DeleteIf(context.Background(), entries, deleted); err != nil {
		t.Fatalf("delete-if %d: %v", len(entries), err)
	}
	for i, d := range deleted {
		if !d {
			t.Fatalf("delete-if of the large batch kept entry %d %s", i, entries[i].Key)
		}
	}
	expectEntries(t, ix, nil)
}

// testConcurrent runs readers against one writer that rewrites a fixed key
// set in whole batches, each batch stamping one round number into every
// record. A Get of the whole key set is one batch and must see one round
// (batches are atomic), as must an Iterate (a snapshot), and rounds never
// go backwards for a reader.
func testConcurrent(t *testing.T, ix indexes.Index) {
	rng := newRand(t, 17)
	const rounds, readers = 60, 4
	entries := randomEntries(rng, 64)
	keys := keysOf(entries)
	stamp := func(round uint64) []indexes.Entry {
		out := slices.Clone(entries)
		for i := range out {
			out[i].Record.Slot = round
			out[i].Record.LastAccess = round
		}
		return out
	}
	mustPut(t, ix, stamp(0))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, readers+2)
	var wg sync.WaitGroup
	// One more reader iterates: an iteration is a snapshot too, so it sees
	// every key at one round.
	wg.Go(func() {
		var last uint64
		for ctx.Err() == nil {
			n, round := 0, uint64(0)
			err := ix.Iterate(context.Background(), func(e indexes.Entry) error {
				if n == 0 {
					round = e.Record.Slot
				}
				n++
				if e.Record.Slot != round || e.Record.LastAccess != round {
					return fmt.Errorf("iteration saw slot %d at entry %d after round %d: not a snapshot", e.Record.Slot, n, round)
				}
				return nil
			})
			if err == nil && n != len(keys) {
				err = fmt.Errorf("iteration saw %d entries, want %d", n, len(keys))
			}
			if err == nil && round < last {
				err = fmt.Errorf("iteration round went back from %d to %d", last, round)
			}
			if err != nil {
				errs <- fmt.Errorf("iterating reader: %w", err)
				return
			}
			last = round
		}
	})
	for r := range readers {
		wg.Go(func() {
			dst := make([]indexes.Record, len(keys))
			found := make([]bool, len(keys))
			var last uint64
			for ctx.Err() == nil {
				if err := ix.Get(context.Background(), keys, dst, found); err != nil {
					errs <- fmt.Errorf("reader %d: get: %w", r, err)
					return
				}
				round := dst[0].Slot
				for i := range keys {
					if !found[i] || dst[i].Slot != round || dst[i].LastAccess != round {
						errs <- fmt.Errorf("reader %d: key %d found=%v slot %d in a get that saw round %d: batch not atomic", r, i, found[i], dst[i].Slot, round)
						return
					}
				}
				if round < last {
					errs <- fmt.Errorf("reader %d: round went back from %d to %d", r, last, round)
					return
				}
				last = round
			}
		})
	}
	wg.Go(func() {
		defer cancel()
		for round := uint64(1); round <= rounds; round++ {
			if err := ix.Put(context.Background(), stamp(round)); err != nil {
				errs <- fmt.Errorf("writer round %d: %w", round, err)
				return
			}
			if round%10 == 0 {
				if err := ix.Touch(context.Background(), keys, round); err != nil {
					errs <- fmt.Errorf("writer touch round %d: %w", round, err)
					return
				}
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	expectEntries(t, ix, stamp(rounds))
}

func testClosed(t *testing.T, ix indexes.Index) {
	rng := newRand(t, 18)
	entries := randomEntries(rng, 3)
	mustPut(t, ix, entries)
	mustClose(t, ix)
	ctx := context.Background()
	keys := keysOf(entries)
	checks := []struct {
		name string
		fn   func() error
	}{
		{"put", func() error { return ix.Put(ctx, entries) }},
		{"get", func() error { return ix.Get(ctx, keys, make([]indexes.Record, 3), make([]bool, 3)) }},
		{"delete", func() error { return ix.Delete(ctx, keys) }},
		{"delete-if", func() error { return ix.DeleteIf(ctx, entries, make([]bool, 3)) }},
		{"touch", func() error { return ix.Touch(ctx, keys, 1) }},
		{"iterate", func() error { return ix.Iterate(ctx, func(indexes.Entry) error { return nil }) }},
		{"stats", func() error { _, err := ix.Stats(ctx); return err }},
		{"empty put", func() error { return ix.Put(ctx, nil) }},
	}
	for _, c := range checks {
		if err := c.fn(); !errors.Is(err, indexes.ErrClosed) {
			t.Errorf("%s after close: err = %v, want ErrClosed", c.name, err)
		}
	}
	if err := ix.Close(); err != nil && !errors.Is(err, indexes.ErrClosed) {
		t.Errorf("second close: %v, want nil or ErrClosed", err)
	}
}

// testCloseDuringIterate closes the index from another goroutine while an
// Iterate callback runs. Calls made from the callback while Close is in
// progress must return (an error, once Close has taken effect) rather than
// deadlock against it, the iteration must end, and Close must return nil.
// What Close does to an iteration in flight (wait for it, or cut it short
// with an error) is the implementation's choice.
func testCloseDuringIterate(t *testing.T, ix indexes.Index) {
	const patience = 10 * time.Second
	rng := newRand(t, 19)
	entries := randomEntries(rng, 20)
	mustPut(t, ix, entries)
	closed := make(chan error, 1)
	seen := 0
	var cbErr error
	iterErr := ix.Iterate(context.Background(), func(e indexes.Entry) error {
		seen++
		if seen > 1 {
			return nil
		}
		go func() { closed <- ix.Close() }()
		cbErr = waitForClose(ix, patience)
		return cbErr
	})
	if cbErr != nil {
		t.Fatal(cbErr)
	}
	if iterErr != nil {
		// Cutting the iteration short is allowed; say how it ended.
		t.Logf("iterate ended with %v after %d entries", iterErr, seen)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("close during iterate: %v", err)
		}
	case <-time.After(patience):
		t.Fatalf("close did not return within %v of the iteration ending", patience)
	}
	if _, err := ix.Stats(context.Background()); !errors.Is(err, indexes.ErrClosed) {
		t.Fatalf("stats after close: %v, want ErrClosed", err)
	}
}

// waitForClose calls Stats until it fails (Close has taken effect). It
// fails if a call blocks or Close takes no effect within patience.
func waitForClose(ix indexes.Index, patience time.Duration) error {
	deadline := time.Now().Add(patience)
	for time.Now().Before(deadline) {
		done := make(chan error, 1)
		go func() {
			_, err := ix.Stats(context.Background())
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				return nil
			}
		case <-time.After(patience):
			return fmt.Errorf("stats from an Iterate callback blocked for %v while Close was in progress", patience)
		}
		runtime.Gosched()
	}
	return fmt.Errorf("close took no effect within %v", patience)
}

// CloseWaitsForIterate checks a stronger promise than Run's: Close does not
// release the index while an iteration is still reading it (the iteration
// sees every entry), and calls from the callback meanwhile get ErrClosed.
// Implementations that keep it (those built on indexes.CloseGate) run it
// beside Run.
func CloseWaitsForIterate(t *testing.T, open Opener) {
	t.Helper()
	ix := open(t)
	entries := randomEntries(newRand(t, 23), 20)
	mustPut(t, ix, entries)
	closed := make(chan error, 1)
	seen := 0
	err := ix.Iterate(context.Background(), func(indexes.Entry) error {
		seen++
		if seen > 1 {
			return nil
		}
		go func() { closed <- ix.Close() }()
		for {
			_, err := ix.Stats(context.Background())
			if errors.Is(err, indexes.ErrClosed) {
				break
			}
			if err != nil {
				return err
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond)
		select {
		case err := <-closed:
			return fmt.Errorf("close returned (%v) while the iteration was running", err)
		default:
			return nil
		}
	})
	if err != nil || seen != len(entries) {
		t.Fatalf("iterate: %v after %d of %d entries", err, seen, len(entries))
	}
	if err := <-closed; err != nil {
		t.Fatalf("close: %v", err)
	}
}

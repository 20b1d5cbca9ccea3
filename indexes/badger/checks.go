package badger

import (
	"bytes"
	"errors"
	"fmt"

	badgerdb "github.com/dgraph-io/badger/v4"

	"github.com/kvtier/kvtier/indexes"
)

// The checks below run only when invariants is on. Each panics with the
// state that proves a broken invariant: a write batch that does not read
// back inside its own transaction, or an iteration out of key order.

// readBack returns the record of k as txn sees it (pending writes
// included), whether it is present, and any error.
func readBack(txn *badgerdb.Txn, k indexes.Key) (indexes.Record, bool, error) {
	var kb [indexes.KeySize]byte
	indexes.EncodeKey(&kb, k)
	item, err := txn.Get(kb[:])
	if errors.Is(err, badgerdb.ErrKeyNotFound) {
		return indexes.Record{}, false, nil
	}
	if err != nil {
		return indexes.Record{}, false, err
	}
	var rec indexes.Record
	err = item.Value(func(v []byte) error {
		rec, err = indexes.DecodeRecord(k, v)
		return err
	})
	return rec, true, err
}

// checkWritten requires txn to hold, for every key of entries, the record
// of the key's last entry.
func (ix *Index) checkWritten(txn *badgerdb.Txn, entries []indexes.Entry) {
	want := make(map[indexes.Key]indexes.Record, len(entries))
	for _, e := range entries {
		want[e.Key] = e.Record
	}
	for k, rec := range want {
		got, ok, err := readBack(txn, k)
		if err != nil || !ok || got != rec {
			panic(fmt.Sprintf("badger index %s: invariant: key %s written as %+v reads back as %+v present=%v (%v)", ix.dir, k, rec, got, ok, err))
		}
	}
}

// checkAbsent requires txn to hold none of keys.
func (ix *Index) checkAbsent(txn *badgerdb.Txn, keys []indexes.Key) {
	for _, k := range keys {
		if rec, ok, err := readBack(txn, k); ok || err != nil {
			panic(fmt.Sprintf("badger index %s: invariant: key %s deleted in this transaction reads back as %+v (%v)", ix.dir, k, rec, err))
		}
	}
}

// checkTouched requires every key of keys present in txn to carry at.
func (ix *Index) checkTouched(txn *badgerdb.Txn, keys []indexes.Key, at uint64) {
	for _, k := range keys {
		rec, ok, err := readBack(txn, k)
		if ok && err == nil && rec.LastAccess != at {
			panic(fmt.Sprintf("badger index %s: invariant: key %s touched at %d reads back with last access %d", ix.dir, k, at, rec.LastAccess))
		}
	}
}

// checkOrder requires key to sort strictly after prev, and records it.
func (ix *Index) checkOrder(prev *[]byte, key []byte) {
	if *prev != nil && bytes.Compare(*prev, key) >= 0 {
		panic(fmt.Sprintf("badger index %s: invariant: iterate yielded key %x after %x", ix.dir, key, *prev))
	}
	*prev = append((*prev)[:0], key...)
}
